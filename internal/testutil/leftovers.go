package testutil

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/pkg/cgroup"
)

// runMarker is set in the environment of the test binary, and so of every
// process its tests start (testutil.Run adds it to the plugins' own): the
// leftover check finds them by it, even those whose parent is gone.
const runMarker = "EBPF_CNI_TEST_RUN"

// run is what a test binary makes, told apart from what other test runs on
// the machine make at the same time: names with this pid, the run's own
// temporary directory (every t.TempDir, every private bpffs and state
// directory is under it), and the mounts, cgroups and processes there were
// before the tests started.
type run struct {
	pid    int
	tmp    string          // TMPDIR of the run
	mounts map[string]bool // mount IDs at the start
}

// cgroupPrefix starts the name of every cgroup Cgroup makes.
func cgroupPrefix() string { return fmt.Sprintf("ebpf-cni-test-%d-", os.Getpid()) }

// startRun gives the run its own TMPDIR and marks its environment.
func startRun() (*run, error) {
	r := &run{pid: os.Getpid(), mounts: map[string]bool{}}
	var err error
	if r.tmp, err = os.MkdirTemp("", fmt.Sprintf("ebpf-cni-test-%d-", r.pid)); err != nil {
		return nil, err
	}
	if err := os.Setenv("TMPDIR", r.tmp); err != nil {
		return nil, err
	}
	if err := os.Setenv(runMarker, strconv.Itoa(r.pid)); err != nil {
		return nil, err
	}
	ms, err := mountinfo()
	if err != nil {
		return nil, err
	}
	for _, m := range ms {
		r.mounts[m.id] = true
	}
	return r, nil
}

type mount struct{ id, point, fstype string }

func mountinfo() ([]mount, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []mount
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		f, pf := strings.Fields(pre), strings.Fields(post)
		if ok && len(f) >= 5 && len(pf) >= 1 {
			out = append(out, mount{id: f[0], point: f[4], fstype: pf[0]})
		}
	}
	return out, sc.Err()
}

// leftovers lists what the run's tests made and did not remove: network
// namespaces with the run's prefix, mounts under its TMPDIR (bpffs, a
// plugin's private cgroup2...) or of its namespaces, cgroups Cgroup made,
// processes it started (the test binary's own excluded).
func (r *run) leftovers() (left []string, clean func()) {
	var undo []func()
	if ents, err := os.ReadDir(nettest.NetNSDir); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), nettest.NetNSPrefix()) {
				p := filepath.Join(nettest.NetNSDir, e.Name())
				left = append(left, "network namespace "+p)
				undo = append(undo, func() { _ = unix.Unmount(p, unix.MNT_DETACH); _ = os.Remove(p) })
			}
		}
	}
	if ms, err := mountinfo(); err == nil {
		// Innermost first, so a detach never takes one still listed along.
		for i := len(ms) - 1; i >= 0; i-- {
			m := ms[i]
			if r.mounts[m.id] || !(under(m.point, r.tmp) || strings.HasPrefix(m.point, filepath.Join(nettest.NetNSDir, nettest.NetNSPrefix()))) {
				continue
			}
			if !strings.HasPrefix(m.point, nettest.NetNSDir) { // a namespace is listed above
				left = append(left, fmt.Sprintf("%s mount at %s", m.fstype, m.point))
			}
			undo = append(undo, func() { _ = unix.Unmount(m.point, unix.MNT_DETACH) })
		}
	}
	for _, pid := range r.processes() {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		left = append(left, fmt.Sprintf("process %d (%s)", pid, strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))))
		undo = append(undo, func() { kill(pid, r.pid) })
	}
	if root, err := cgroup.V2Root(); err == nil {
		if ents, err := os.ReadDir(root); err == nil {
			for _, e := range ents {
				if e.IsDir() && strings.HasPrefix(e.Name(), cgroupPrefix()) {
					p := filepath.Join(root, e.Name())
					left = append(left, "cgroup "+p)
					undo = append(undo, func() {
						for i := 0; i < 50 && os.Remove(p) != nil; i++ {
							time.Sleep(20 * time.Millisecond) // until the killed processes are gone
						}
					})
				}
			}
		}
	}
	return left, func() {
		for _, f := range undo {
			f()
		}
	}
}

// processes are the pids, other than the test binary's, whose environment
// carries the run's marker, and the test binary's children (a zombie has no
// environment left to read).
func (r *run) processes() []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	want := []byte(runMarker + "=" + strconv.Itoa(r.pid) + "\x00")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == r.pid {
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err == nil && bytes.Contains(append([]byte{0}, env...), append([]byte{0}, want...)) {
			out = append(out, pid)
			continue
		}
		if ppid(pid) == r.pid {
			out = append(out, pid)
		}
	}
	return out
}

// kill ends a leftover process and waits until it is gone, reaping it if
// it is the test binary's child that nobody waits for.
func kill(pid, self int) {
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for i := 0; i < 100; i++ {
		if ppid(pid) == self {
			var ws unix.WaitStatus
			_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func ppid(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0
	}
	p, _ := strconv.Atoi(f[1])
	return p
}

func under(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, dir+"/")
}

// finish reports what the run left, removes it, and removes the run's
// TMPDIR. It returns an error when anything was left.
func (r *run) finish() error {
	left, clean := r.leftovers()
	clean()
	if err := os.RemoveAll(r.tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		left = append(left, fmt.Sprintf("%s cannot be removed: %v", r.tmp, err))
	}
	if len(left) == 0 {
		return nil
	}
	return fmt.Errorf("the tests left behind (now removed):\n  %s", strings.Join(left, "\n  "))
}
