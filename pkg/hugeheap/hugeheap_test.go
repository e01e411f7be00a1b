package hugeheap

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"
)

// sink keeps the test's allocations on the heap.
var sink [][]byte

// childEnv marks the test binary that TestCallProcess runs as a CNI call.
const childEnv = "HUGEHEAP_TEST_CHILD"

// parentSlackEnv tells the child the timer slack of the process that
// started it (TestNarrow).
const parentSlackEnv = "HUGEHEAP_TEST_PARENT_SLACK"

// vmaOf returns the /proc/self/smaps entry of the mapping holding addr.
func vmaOf(t *testing.T, addr uintptr) (lo, hi uintptr, fields map[string]string) {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	found := false
	for s.Scan() {
		line := s.Text()
		var a, b uintptr
		if n, _ := fmt.Sscanf(line, "%x-%x ", &a, &b); n == 2 && strings.Contains(strings.Fields(line)[0], "-") {
			if found {
				return lo, hi, fields
			}
			if a <= addr && addr < b {
				found, lo, hi, fields = true, a, b, map[string]string{}
			}
			continue
		}
		if found {
			if k, v, ok := strings.Cut(line, ":"); ok {
				fields[k] = strings.TrimSpace(v)
			}
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if !found {
		t.Fatalf("no mapping holds %#x", addr)
	}
	return lo, hi, fields
}

// A process that is not a CNI call (the CLI, this test binary) is left
// alone: the collector on, the heap where the runtime put it.
func TestNotACall(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("the child is a call")
	}
	if call || region != 0 || pads[0] != nil || nholes != 0 {
		t.Fatalf("init took a test binary for a call: call %v, region %#x, pads %d, holes %d", call, region, len(pads[0]), nholes)
	}
	if runtime.MemProfileRate == 0 {
		t.Fatal("init turned the heap profile off in a test binary")
	}
	if slackThreads != 0 {
		t.Fatalf("init set the timer slack of %d threads of a test binary", slackThreads)
	}
	if os.Getenv("GOMAXPROCS") == "" && runtime.NumCPU() > 1 && runtime.GOMAXPROCS(0) == 1 {
		t.Fatal("init put a test binary on one P")
	}
	if Procs() != 0 {
		t.Fatalf("Procs() = %d in a test binary", Procs())
	}
	if s := threadSlack(t, fmt.Sprint(syscall.Gettid())); s == slackNs {
		t.Fatalf("this thread's timer slack is %d ns, a call's", s)
	}
	if os.Getenv("GOGC") == "" {
		if prev := debug.SetGCPercent(100); prev != 100 {
			t.Fatalf("the collector was turned off (GOGC %d)", prev)
		}
	}
}

// The test binary again, with CNI_COMMAND set: init takes it for a call.
func TestCallProcess(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("in the child")
	}
	// An ADD, and a DEL whose caller set GOMAXPROCS (TestProcs).
	for _, env := range [][]string{{"CNI_COMMAND=ADD"}, {"CNI_COMMAND=DEL", "GOMAXPROCS=2"}} {
		verb := env[0]
		cmd := exec.Command(os.Args[0], "-test.run=^(TestInCall|TestMoveAgain|TestSlack|TestProcs|TestNarrow)$", "-test.v", "-test.count=1")
		cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GOMAXPROCS=") }),
			append(env, childEnv+"=1", parentSlackEnv+"="+strconv.Itoa(threadSlack(t, "self")))...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("the %s child: %v\n%s", verb, err, out)
		}
		for _, name := range []string{"TestInCall", "TestMoveAgain", "TestSlack", "TestProcs", "TestNarrow"} {
			if !strings.Contains(string(out), "--- PASS: "+name) && !strings.Contains(string(out), "--- SKIP: "+name) {
				t.Fatalf("the %s child ran no %s:\n%s", verb, name, out)
			}
		}
		t.Logf("the %s child:\n%s", verb, out)
	}
}

// A call runs on one P, unless its caller set GOMAXPROCS.
func TestProcs(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("runs in TestCallProcess's children")
	}
	want := 1
	if v := os.Getenv("GOMAXPROCS"); v != "" {
		want, _ = strconv.Atoi(v)
		if Procs() != 0 {
			t.Fatalf("Procs() = %d, want 0: the caller set GOMAXPROCS", Procs())
		}
	} else if Procs() < 1 {
		t.Fatalf("Procs() = %d: init did not say what GOMAXPROCS it replaced", Procs())
	}
	if got := runtime.GOMAXPROCS(0); got != want {
		t.Fatalf("a %s call runs on %d Ps, want %d", os.Getenv("CNI_COMMAND"), got, want)
	}
}

func TestOneProc(t *testing.T) {
	for _, c := range []struct {
		env  []string
		want bool
	}{
		{[]string{"PATH=/bin", "CNI_COMMAND=ADD"}, true},
		{[]string{"CNI_COMMAND=DEL"}, true},
		{[]string{"CNI_COMMAND=ADD", "GOMAXPROCS=4"}, false},
		{[]string{"GOMAXPROCS=", "CNI_COMMAND=ADD"}, true},
		{[]string{"XGOMAXPROCS=4"}, true},
	} {
		if got := oneProc(c.env); got != c.want {
			t.Errorf("oneProc(%q) = %v, want %v", c.env, got, c.want)
		}
	}
}

func TestInCall(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("runs in TestCallProcess's child")
	}
	if !call {
		t.Fatal("init did not take a process with CNI_COMMAND for a call")
	}
	if prev := debug.SetGCPercent(-1); prev != -1 {
		t.Fatalf("the collector is on in a call (GOGC %d)", prev)
	}
	if runtime.MemProfileRate != 0 {
		t.Fatalf("allocations are sampled for a heap profile in a call (MemProfileRate %d)", runtime.MemProfileRate)
	}
	if !madviseMode() {
		if region != 0 {
			t.Fatalf("the heap moved to %#x without madvise mode", region)
		}
		t.Skip("transparent huge pages are not in madvise mode: the heap stays")
	}
	if region == 0 || region%hugeBytes != 0 {
		t.Fatalf("init did not move the heap to a huge-page boundary: region %#x", region)
	}
	lo, hi, f := vmaOf(t, region)
	if lo > region || hi < region+hugeBytes {
		t.Fatalf("the region %#x is not in one mapping: %#x-%#x", region, lo, hi)
	}
	if !slices.Contains(strings.Fields(f["VmFlags"]), "hg") {
		t.Fatalf("VmFlags at the boundary: %s", f["VmFlags"])
	}
	// init's stack growth touched it: one huge page, not 4 KiB ones.
	if f["AnonHugePages"] == "0 kB" {
		t.Fatalf("no huge page behind the heap: %v", f)
	}
	// And the heap goes on there: init's last one-page object came from
	// there (the cache of init's P, from which the call's small objects
	// come as long as it runs there), and a large object comes first fit.
	last := uintptr(unsafe.Pointer(holes[nholes-1]))
	if last < region || last >= region+hugeBytes {
		t.Fatalf("init's last page at %#x, the region at %#x", last, region)
	}
	large := make([]byte, largeBytes)
	sink = append(sink, large) // on the heap, not the stack
	at := uintptr(unsafe.Pointer(unsafe.SliceData(large)))
	if at < region || at >= region+hugeBytes {
		t.Fatalf("an allocation after init at %#x, the region at %#x", at, region)
	}
}

// A move that finds the region touched before its flag went on (another
// thread of the runtime allocated there first) tries the next 2 MiB.
func TestMoveAgain(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("runs in TestCallProcess's child")
	}
	if !madviseMode() {
		t.Skip("transparent huge pages are not in madvise mode")
	}
	var spoiled []uintptr
	beforeCheck = func(h *[8192]byte) {
		if len(spoiled) == 0 {
			h[0] = 1 // resident now, as another thread's first allocation would be
			spoiled = append(spoiled, uintptr(unsafe.Pointer(h))&^(hugeBytes-1))
		}
	}
	defer func() { beforeCheck = nil }()
	r := move()
	if len(spoiled) != 1 {
		t.Fatalf("the hook ran %d times", len(spoiled))
	}
	if r == 0 || r%hugeBytes != 0 || r <= spoiled[0] {
		t.Fatalf("move after a touched region at %#x: %#x", spoiled[0], r)
	}
	if _, _, f := vmaOf(t, r); !slices.Contains(strings.Fields(f["VmFlags"]), "hg") {
		t.Fatalf("VmFlags of the second region: %s", f["VmFlags"])
	}
}

// threadSlack reads the timer slack of thread tid (/proc/<tid> is there
// for every thread, though /proc lists only processes).
func threadSlack(t *testing.T, tid string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + tid + "/timerslack_ns")
	if err != nil {
		t.Fatal(err)
	}
	var ns int
	if _, err := fmt.Sscan(string(b), &ns); err != nil {
		t.Fatalf("/proc/%s/timerslack_ns: %q", tid, b)
	}
	return ns
}

// In a call every thread has the wide timer slack: the ones init found
// (the main thread and sysmon at least) and the ones started since, which
// inherit it.
func TestSlack(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("runs in TestCallProcess's child")
	}
	if os.Geteuid() != 0 {
		t.Skip("setting another thread's timer slack takes CAP_SYS_NICE")
	}
	if slackThreads < 2 {
		t.Fatalf("init set the timer slack of %d threads, want the main thread and sysmon at least", slackThreads)
	}
	t.Logf("%d threads at init, %d now", slackThreads, allSlack(t, slackNs))
}

// allSlack checks that every thread of the process has the timer slack
// want; it returns how many threads there are.
func allSlack(t *testing.T, want int) int {
	t.Helper()
	tids, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, tid := range tids {
		if s := threadSlack(t, tid.Name()); s != want {
			t.Errorf("thread %s: timer slack %d ns, want %d", tid.Name(), s, want)
		}
	}
	return len(tids)
}

// Narrow gives every thread the slack the process started with (its
// parent's, what init read before widening it) and its restore widens it
// again, for threads started meanwhile too.
func TestNarrow(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("runs in TestCallProcess's child")
	}
	if os.Geteuid() != 0 {
		t.Skip("setting another thread's timer slack takes CAP_SYS_NICE")
	}
	parent, err := strconv.Atoi(os.Getenv(parentSlackEnv))
	if err != nil {
		t.Fatalf("%s: %v", parentSlackEnv, err)
	}
	if int(defaultSlack) != parent || parent == slackNs {
		t.Fatalf("init read a default slack of %d ns, want the parent's %d (not a call's %d)", defaultSlack, parent, slackNs)
	}
	restore := Narrow()
	allSlack(t, parent)
	// A thread started now inherits the narrow slack; one locked to a
	// goroutine that waits keeps existing until restore.
	started, done := make(chan struct{}), make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		close(started)
		<-done
	}()
	<-started
	allSlack(t, parent)
	restore()
	allSlack(t, slackNs)
	close(done)
}
