package hugeheap

import "unsafe"

// slackNs is the timer slack of a call's threads: how much later than asked
// the kernel may end a thread's timed sleep, to wake it together with
// other timers (50 µs by default). slackText is the same, as
// /proc/<tid>/timerslack_ns takes it.
const (
	slackNs   = 5_000_000
	slackText = "5000000"
)

// The runtime's sysmon thread sleeps 20 µs at a time for the first
// millisecond of a busy process, then twice as long each round up to 10
// ms: a call of 15-30 ms wakes it a hundred times or more (166 sleeps in a
// DEL under strace), each wakeup a timer interrupt and two context
// switches, which a virtual machine pays in exits. With a wider slack its
// sleeps end with the call's other wakeups. sysmon wakes the process's
// threads to run what waits (a P held by a blocking system call, a
// goroutine to preempt after 10 ms, the network poller after 10 ms); in a
// call, a goroutine that becomes runnable gets an idle P at once, and
// nothing of ours waits on a timer shorter than a second.
//
// Measured on a simulated node (alternated builds, 24 ADD+DEL pairs by 8
// rounds): CPU per ADD+DEL 37.7 → 32.6 ms, context switches per pair at
// concurrency 8 401 → 219, and ADD p50 at concurrency 8 122 → 97 ms
// (docs/performance.md, the eleventh pass).
//
// widenSlack sets slackNs on every thread the process has (sysmon started
// before any package initialises, and a thread's slack is its own); the
// threads started later inherit it from the one that starts them, and so
// do the processes a call executes. Setting another thread's slack takes
// CAP_SYS_NICE, which a runtime's plugins have: without it the threads
// keep theirs. It returns how many threads it set.
func widenSlack() int {
	return setSlackAll(slackText)
}

// setSlackAll writes text (nanoseconds) as the timer slack of every thread
// of the process; it returns how many it set.
func setSlackAll(text string) int {
	fd, _, e := rawSyscall6(sysOpenat, atFDCWD, uintptr(unsafe.Pointer(unsafe.StringData(taskDir))),
		oRDONLY|oDIRECTORY|oCLOEXEC, 0, 0, 0)
	if e != 0 {
		return 0
	}
	defer rawSyscall6(sysClose, fd, 0, 0, 0, 0, 0)
	set := 0
	var buf [512]byte // small: init's stack is not grown yet
	for {
		got, _, e := rawSyscall6(sysGetdents64, fd, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), 0, 0, 0)
		if e != 0 || got == 0 || got > uintptr(len(buf)) {
			return set
		}
		// struct linux_dirent64: d_ino (8 bytes), d_off (8), d_reclen
		// (2), d_type (1), then the name, NUL-terminated.
		for off := 0; off+19 < int(got); {
			reclen := int(buf[off+16]) | int(buf[off+17])<<8
			if reclen < 19 || off+reclen > int(got) {
				return set
			}
			if setSlack(buf[off+19:off+reclen], text) {
				set++
			}
			off += reclen
		}
	}
}

// taskDir lists the process's threads; NUL-terminated for the system call.
const taskDir = "/proc/self/task\x00"

// setSlack writes text to /proc/<tid>/timerslack_ns (there for every
// thread, though /proc lists only processes; the task directory's has
// none), tid the directory entry name, NUL-terminated: ".", ".." and
// anything not a thread ID is skipped.
func setSlack(name []byte, text string) bool {
	const prefix, suffix = "/proc/", "/timerslack_ns\x00"
	var path [64]byte
	n := copy(path[:], prefix)
	digits := 0
	for _, c := range name {
		if c == 0 {
			break
		}
		if c < '0' || c > '9' || n+len(suffix) >= len(path) {
			return false
		}
		path[n] = c
		n++
		digits++
	}
	if digits == 0 {
		return false
	}
	copy(path[n:], suffix)
	fd, _, e := rawSyscall6(sysOpenat, atFDCWD, uintptr(unsafe.Pointer(&path[0])), oWRONLY|oCLOEXEC, 0, 0, 0)
	if e != 0 {
		return false
	}
	w, _, e := rawSyscall6(sysWrite, fd, uintptr(unsafe.Pointer(unsafe.StringData(text))), uintptr(len(text)), 0, 0, 0)
	rawSyscall6(sysClose, fd, 0, 0, 0, 0, 0)
	return e == 0 && w == uintptr(len(text))
}

// prGetTimerslack is PR_GET_TIMERSLACK: prctl returns the calling thread's
// timer slack in nanoseconds.
const prGetTimerslack = 30

// defaultSlack is the timer slack the process's main thread had before
// init widened it (what its parent gave it: 50 µs unless changed); zero
// when init did not widen it.
var defaultSlack uintptr

// ownSlack is the calling thread's timer slack, or zero.
func ownSlack() uintptr {
	if sysPrctl == 0 {
		return 0
	}
	v, _, e := rawSyscall6(sysPrctl, prGetTimerslack, 0, 0, 0, 0, 0)
	if e != 0 {
		return 0
	}
	return v
}

// Narrow gives every thread of a call the timer slack it started with
// until restore widens it again. For what stops the world or waits on
// short timers: the collector (programs.Load turns it on for a load: its
// stop-the-world phases wait 100 µs at a time for the other Ps, and its
// workers park and wake on timers) and a change of GOMAXPROCS. Outside a
// call, or when init could not widen the slack, it does nothing.
func Narrow() (restore func()) {
	if slackThreads == 0 || defaultSlack == 0 {
		return func() {}
	}
	setSlackAll(decimal(defaultSlack))
	return func() { setSlackAll(slackText) }
}

// decimal is v in decimal digits (strconv would be an import).
func decimal(v uintptr) string {
	var buf [20]byte
	i := len(buf)
	for {
		i--
		buf[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			return string(buf[i:])
		}
	}
}
