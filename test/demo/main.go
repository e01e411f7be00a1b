// Command demo shows ebpf-cni on a simulated node: a "node" netns with an
// uplink to a "world" netns, three pods attached through the real binaries
// with libcni, their addresses, pod-to-pod ping and TCP, pod-to-node, a
// spoofed ping, and then what the operator CLI (bin/ebpf-cni without
// CNI_COMMAND) shows: the endpoints, the node's status, and the counters
// that say which path the packets took and why one was dropped. Everything
// lives in namespaces made here (and a private bpffs); it is all removed on
// exit and on Ctrl-C. Run as root: sudo make demo.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
)

func main() {
	bin := flag.String("bin", "bin", "directory holding ebpf-cni and ebpf-ipam")
	ref := flag.String("ref", "/usr/lib/cni", "directory of the reference plugins")
	mode := flag.String("attach-mode", "auto", "attachMode: auto, tcx or tc")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: needs root (sudo make demo)")
		os.Exit(1)
	}
	d := &demo{}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		fmt.Println("\ninterrupted: cleaning up")
		d.cleanup()
		os.Exit(130)
	}()
	err := d.run(*bin, *ref, *mode)
	d.cleanup()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

type demo struct {
	mu   sync.Mutex // cleanup runs once, whether from main or the signal handler
	tmp  string
	mnt  string
	node *nettest.Node
	cni  *nettest.CNI
	list *libcni.NetworkConfigList
	pods []*nettest.Pod
}

func (d *demo) run(bin, ref, mode string) error {
	var err error
	bin, err = filepath.Abs(bin)
	if err != nil {
		return err
	}
	if d.tmp, err = os.MkdirTemp("", "ebpf-cni-demo-"); err != nil {
		return err
	}
	d.mnt = filepath.Join(d.tmp, "bpffs")
	if err := os.Mkdir(d.mnt, 0o700); err != nil {
		return err
	}
	if err := unix.Mount("bpf", d.mnt, "bpf", 0, ""); err != nil {
		return fmt.Errorf("mounting a private bpffs: %w", err)
	}
	bpfRoot := filepath.Join(d.mnt, "ebpf-cni")
	stateDir := filepath.Join(d.tmp, "state")

	step("a node namespace -- uplink veth -- a world namespace; node uplink 192.0.2.2/24 2001:db8:ffff::2/64")
	if d.node, err = nettest.NewNode(); err != nil {
		return err
	}
	conf := map[string]any{
		"cniVersion": "1.1.0", "name": "demo",
		"plugins": []any{map[string]any{
			"type": "ebpf-cni", "bpfRoot": bpfRoot, "stateDir": stateDir, "attachMode": mode,
			"ipam": map[string]any{"type": "ebpf-ipam", "ranges": []any{
				[]any{map[string]any{"subnet": "10.244.0.0/24"}},
				[]any{map[string]any{"subnet": "fd00:244::/64"}},
			}},
		}},
	}
	b, _ := json.MarshalIndent(conf, "", "  ")
	fmt.Printf("network configuration:\n%s\n", b)
	if d.list, err = libcni.ConfListFromBytes(b); err != nil {
		return err
	}
	d.cni = nettest.NewCNI(d.node, []string{bin, ref}, filepath.Join(d.tmp, "cache"))

	step("ADD three pods through libcni (%s/ebpf-cni, ebpf-ipam)", bin)
	for i := range 3 {
		p, err := d.cni.AddPod(d.list, fmt.Sprintf("demo-pod-%d", i), nil)
		if err != nil {
			return fmt.Errorf("ADD pod %d: %w", i, err)
		}
		d.mu.Lock()
		d.pods = append(d.pods, p)
		d.mu.Unlock()
		fmt.Printf("  pod%d  %-15s %-22s host veth %s\n", i, p.IP(4), p.IP(6), p.Result.Interfaces[0].Name)
	}
	out, _ := nettest.Run(d.node.NS, "ip", "-br", "link")
	fmt.Printf("node links (no bridge):\n%s", out)

	step("pod-to-pod ping and TCP (IPv4 and IPv6)")
	for i, a := range d.pods {
		bp := d.pods[(i+1)%len(d.pods)]
		for _, fam := range []int{4, 6} {
			dst := bp.IP(fam)
			if o, err := nettest.Ping(a.NS, dst, 3); err != nil {
				return fmt.Errorf("ping pod%d -> %s: %w\n%s", i, dst, err, o)
			}
			if err := nettest.TCP(a.NS, bp.NS, dst); err != nil {
				return fmt.Errorf("tcp pod%d -> %s: %w", i, dst, err)
			}
			fmt.Printf("  pod%d -> %-22s ping ok, tcp ok\n", i, dst)
		}
	}
	out, _ = nettest.Run(d.pods[0].NS, "ping", "-n", "-c", "3", "-i", "0.2", d.pods[1].IP(4).String())
	fmt.Print(out)

	step("pod-to-node and node-to-pod")
	for i, p := range d.pods {
		if o, err := nettest.Ping(p.NS, nettest.NodeIP4, 2); err != nil {
			return fmt.Errorf("ping pod%d -> node: %w\n%s", i, err, o)
		}
		if o, err := nettest.Ping(d.node.NS, p.IP(6), 2); err != nil {
			return fmt.Errorf("ping node -> pod%d: %w\n%s", i, err, o)
		}
		fmt.Printf("  pod%d <-> node ok\n", i)
	}

	step("pod0 sends from an address that is not its own (anti-spoofing)")
	if _, err := nettest.Run(d.pods[0].NS, "ip", "addr", "add", "10.244.0.250/32", "dev", "eth0"); err != nil {
		return err
	}
	if o, err := nettest.Run(d.pods[0].NS, "ping", "-n", "-c", "3", "-i", "0.2", "-W", "1", "-I", "10.244.0.250", d.pods[1].IP(4).String()); err == nil {
		return fmt.Errorf("a spoofed ping got through:\n%s", o)
	}
	fmt.Println("  ping -I 10.244.0.250 pod1: no reply (dropped at pod0's host veth)")

	cli := func(args ...string) error {
		args = append(args, "--bpf-root", bpfRoot, "--state-dir", stateDir)
		fmt.Printf("$ ebpf-cni %s\n", strings.Join(args[:len(args)-4], " "))
		return d.node.NS.Do(func(ns.NetNS) error {
			cmd := exec.Command(filepath.Join(bin, "ebpf-cni"), args...)
			cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // no CNI_COMMAND: the operator CLI
			cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
			return cmd.Run()
		})
	}
	step("what the node holds, as an operator sees it (the ebpf-cni CLI, run in the node's netns)")
	if err := cli("endpoints"); err != nil {
		return err
	}
	if err := cli("status"); err != nil {
		return err
	}
	step("what happened to the packets: redirect_peer pod to pod, pass to the node, drop by reason")
	if err := cli("counters"); err != nil {
		return err
	}
	fmt.Println("  (redirect: pod to pod, no bridge, no netfilter; pass: to the node, NDP; drop_spoof_src: pod0's spoofed pings)")

	step("DEL the pods")
	return d.delPods()
}

func (d *demo) delPods() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for len(d.pods) > 0 {
		if err := d.cni.DelPod(d.list, d.pods[0]); err != nil {
			return fmt.Errorf("DEL %s: %w", d.pods[0].RT.ContainerID, err)
		}
		d.pods = d.pods[1:]
	}
	fmt.Println("  done")
	return nil
}

// cleanup undoes what exists, each step once; the signal handler waits for
// a cleanup already under way instead of exiting in its middle.
func (d *demo) cleanup() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range d.pods {
		_ = d.cni.DelPod(d.list, p)
	}
	d.pods = nil
	if d.node != nil {
		d.node.Close()
		d.node = nil
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

func step(format string, args ...any) {
	fmt.Printf("\n== %s\n", fmt.Sprintf(format, args...))
}
