// Command demo tells what ebpf-cni does, in under a minute, on a
// simulated node: a "node" netns with an uplink veth to a "world" netns,
// pods attached through the real binaries with libcni. Each step is one
// short titled block: pods and their addresses (dual stack); pod to pod
// through bpf_redirect_peer with no packet in the FORWARD chain; a pod
// reaching the world masqueraded; a hostPort reached from the world and
// from the node's localhost; a bandwidth limit and the rate iperf3
// measures; a spoofed packet dropped; ADD and DEL time side by side with
// Debian's bridge + iptables chain on a second simulated node; and what
// the operator CLI shows. Everything lives in namespaces, a private bpffs
// and a cgroup made here, and is removed on exit and on Ctrl-C (SIGINT,
// SIGTERM). Run as root: sudo make demo.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/pkg/cgroup"
)

func main() {
	bin := flag.String("bin", "bin", "directory holding ebpf-cni and ebpf-ipam")
	ref := flag.String("ref", "/usr/lib/cni", "directory of Debian's reference plugins")
	sysroot := flag.String("sysroot", "/", "root of the /proc and /sys files the kernel check reads (tests point it elsewhere)")
	flag.Parse()
	var err error
	if *bin, err = filepath.Abs(*bin); err == nil {
		err = preflight(*sysroot, *bin, *ref)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	d := &demo{bin: *bin, ref: *ref}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sig
		d.signaled.Store(true)
		fmt.Printf("\n%s: removing what the demo made\n", s)
		d.cleanup()
		fmt.Println("removed")
		os.Exit(130)
	}()
	start := time.Now()
	err = d.run()
	d.cleanup()
	if d.signaled.Load() {
		select {} // the signal handler is cleaning up, and exits
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	fmt.Printf("\ndemo done in %.1f s; everything it made is removed\n", time.Since(start).Seconds())
}

var errStopped = errors.New("interrupted")

// demo holds what the demo made, so that cleanup removes exactly that.
type demo struct {
	bin, ref string
	signaled atomic.Bool

	mu       sync.Mutex // held while something is made, so cleanup sees all of it
	stopped  bool
	tmp      string
	mnt      string // private bpffs
	cgDir    string // the demo's cgroup (cgroupPath): the socket hooks see only its sockets
	leave    func() error
	nodes    []*nettest.Node
	attached []attached

	bpfRoot, stateDir string
	node              *nettest.Node
	cni               *nettest.CNI
	list              *libcni.NetworkConfigList
}

// attached is a pod and the network it was attached to.
type attached struct {
	cni  *nettest.CNI
	list *libcni.NetworkConfigList
	pod  *nettest.Pod
}

// locked runs f unless the demo is being stopped; cleanup waits for it.
func (d *demo) locked(f func() error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return errStopped
	}
	return f()
}

// prepare makes the private bpffs, the cgroup the demo runs in and the
// node, and writes the network configurations.
func (d *demo) prepare() (ref *libcni.NetworkConfigList, err error) {
	err = d.locked(func() error {
		var err error
		if d.tmp, err = os.MkdirTemp("", "ebpf-cni-demo-"); err != nil {
			return err
		}
		mnt := filepath.Join(d.tmp, "bpffs")
		if err := os.Mkdir(mnt, 0o700); err != nil {
			return err
		}
		if err := unix.Mount("bpf", mnt, "bpf", 0, ""); err != nil {
			return fmt.Errorf("mounting a private bpffs: %w", err)
		}
		d.mnt = mnt
		root, err := cgroup.V2Root()
		if err != nil {
			return err
		}
		if d.cgDir, err = os.MkdirTemp(root, "ebpf-cni-demo-"); err != nil {
			return fmt.Errorf("making the demo's cgroup: %w", err)
		}
		if d.leave, err = cgroup.Join(d.cgDir); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	d.bpfRoot, d.stateDir = filepath.Join(d.mnt, "ebpf-cni"), filepath.Join(d.tmp, "state")
	ebpfConf, refConf := confLists(d.bpfRoot, d.stateDir, d.cgDir, d.tmp)
	if d.list, err = libcni.ConfListFromBytes(ebpfConf); err != nil {
		return nil, err
	}
	if ref, err = libcni.ConfListFromBytes(refConf); err != nil {
		return nil, err
	}
	if d.node, err = d.newNode(); err != nil {
		return nil, err
	}
	d.cni = nettest.NewCNI(d.node, []string{d.bin, d.ref}, filepath.Join(d.tmp, "cache"))
	return ref, nil
}

// newNode makes a simulated node with FORWARD chains whose policy
// counters say how many packets the node forwarded through netfilter.
func (d *demo) newNode() (*nettest.Node, error) {
	var n *nettest.Node
	err := d.locked(func() error {
		var err error
		if n, err = nettest.NewNode(); err != nil {
			return err
		}
		d.nodes = append(d.nodes, n)
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, ipt := range []string{"iptables", "ip6tables"} {
		if _, err := nettest.Run(n.NS, ipt, "-P", "FORWARD", "ACCEPT"); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// addPod attaches a new pod netns as id/eth0 and says how long the ADD
// alone took (as a runtime sees it: the netns is made beforehand).
func (d *demo) addPod(c *nettest.CNI, list *libcni.NetworkConfigList, id string, caps map[string]any) (*nettest.Pod, time.Duration, error) {
	var p *nettest.Pod
	var took time.Duration
	err := d.locked(func() error {
		n, err := nettest.NewNetNS()
		if err != nil {
			return err
		}
		rt := &libcni.RuntimeConf{ContainerID: id, NetNS: n.Path(), IfName: "eth0", CapabilityArgs: caps}
		t0 := time.Now()
		res, err := c.Add(list, rt)
		took = time.Since(t0)
		if err != nil {
			nettest.CloseNetNS(n)
			return fmt.Errorf("ADD %s: %w", id, err)
		}
		p = &nettest.Pod{NS: n, RT: rt, Result: res}
		d.attached = append(d.attached, attached{c, list, p})
		return nil
	})
	return p, took, err
}

// delPod detaches a pod, says how long DEL took, and removes its netns.
func (d *demo) delPod(p *nettest.Pod) (time.Duration, error) {
	var took time.Duration
	err := d.locked(func() error {
		for i, a := range d.attached {
			if a.pod != p {
				continue
			}
			t0 := time.Now()
			err := a.cni.Del(a.list, p.RT)
			took = time.Since(t0)
			nettest.CloseNetNS(p.NS)
			d.attached = append(d.attached[:i], d.attached[i+1:]...)
			if err != nil {
				return fmt.Errorf("DEL %s: %w", p.RT.ContainerID, err)
			}
			return nil
		}
		return fmt.Errorf("DEL %s: not attached", p.RT.ContainerID)
	})
	return took, err
}

// cleanup removes what exists, each thing once: the processes the demo
// started, the pods (DEL), the nodes, the cgroup, the bpffs, the files. It
// waits for an ADD or DEL in flight.
func (d *demo) cleanup() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopped = true
	killChildren()
	for i := len(d.attached) - 1; i >= 0; i-- {
		a := d.attached[i]
		_ = a.cni.DelPod(a.list, a.pod)
	}
	d.attached = nil
	for _, n := range d.nodes {
		n.Close()
	}
	d.nodes = nil
	if d.leave != nil {
		if err := d.leave(); err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
		}
		d.leave = nil
	}
	if d.cgDir != "" {
		// A killed child leaves the cgroup when it has exited: give it a
		// moment (up to 5 s: on a loaded machine 1 s was once too little).
		for i := 0; i < 250; i++ {
			if err := os.Remove(d.cgDir); err == nil || os.IsNotExist(err) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		d.cgDir = ""
	}
	if d.mnt != "" {
		_ = unix.Unmount(d.mnt, unix.MNT_DETACH)
		d.mnt = ""
	}
	if d.tmp != "" {
		_ = os.RemoveAll(d.tmp)
		d.tmp = ""
	}
}

// killChildren ends the processes this demo started and has not reaped
// (iperf3, ping, the CLI), by their process ID.
func killChildren() {
	self := os.Getpid()
	dirs, _ := os.ReadDir("/proc")
	for _, e := range dirs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so cut at the last ')'.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(self) {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
}

// step starts a titled block; say writes one line of it.
func step(n int, format string, args ...any) {
	fmt.Printf("\n== %d. %s\n", n, fmt.Sprintf(format, args...))
}

func say(format string, args ...any) { fmt.Printf("  "+format+"\n", args...) }
