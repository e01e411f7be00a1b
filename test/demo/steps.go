package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
)

// The demo's ports and limits.
const (
	worldPort = 7000 // whoami in the world
	hostPort  = 8080 // published by pod1 ...
	podPort   = 80   // ... to its port 80
	bwRate    = 20_000_000
	// kubelet's "no burst" (a pod that sets only kubernetes.io/egress-bandwidth)
	kubeletBurst = 2_147_483_647
)

// run tells the story; each step checks what it shows and fails the demo
// when the product does not do what it says.
func (d *demo) run() error {
	fmt.Println("ebpf-cni demo: a simulated node (network namespaces), the real ebpf-cni and ebpf-ipam binaries")
	fmt.Println("called through libcni as a runtime calls them. No packet leaves the namespaces made here.")
	refList, err := d.prepare()
	if err != nil {
		return err
	}
	step(1, "The node and its network configuration")
	say("node netns %s, uplink %s/24 %s/64  <-- veth -->  world netns %s: %s %s",
		filepath.Base(d.node.NS.Path()), nettest.NodeIP4, nettest.NodeIP6, filepath.Base(d.node.World.Path()), nettest.WorldIP4, nettest.WorldIP6)
	say("/etc/cni/net.d/10-ebpf-cni.conflist, as README.md installs it; bpfRoot, stateDir and socketCgroupPath point at this demo's own:")
	for _, l := range strings.Split(string(d.list.Bytes), "\n") {
		say("  %s", l)
	}

	pods, err := d.stepPods()
	if err != nil {
		return err
	}
	if err := d.stepPodToPod(pods); err != nil {
		return err
	}
	if err := d.stepMasquerade(pods[0]); err != nil {
		return err
	}
	if err := d.stepHostPort(pods[1]); err != nil {
		return err
	}
	if err := d.stepBandwidth(pods[0], pods[2]); err != nil {
		return err
	}
	if err := d.stepSpoof(pods[0], pods[1]); err != nil {
		return err
	}
	if err := d.stepSideBySide(refList, pods[0], pods[1]); err != nil {
		return err
	}
	if err := d.stepCLI(); err != nil {
		return err
	}
	step(10, "DEL every pod")
	for _, p := range pods {
		took, err := d.delPod(p)
		if err != nil {
			return err
		}
		say("DEL %s: %.0f ms", p.RT.ContainerID, ms(took))
	}
	out, err := d.cliOutput("endpoints")
	if err != nil {
		return err
	}
	say("ebpf-cni endpoints afterwards: %s", strings.TrimSpace(out))
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func (d *demo) stepPods() ([]*nettest.Pod, error) {
	step(2, "Pods and their addresses: ADD through libcni, one veth pair each, dual stack")
	specs := []struct {
		id, what string
		caps     map[string]any
	}{
		{"pod0", "", nil},
		{"pod1", fmt.Sprintf("publishes hostPort %d -> %d/tcp", hostPort, podPort), map[string]any{"portMappings": []any{
			map[string]any{"hostPort": hostPort, "containerPort": podPort, "protocol": "tcp"}}}},
		{"pod2", fmt.Sprintf("egress limit %d Mbit/s", bwRate/1_000_000), map[string]any{"bandwidth": map[string]any{
			"egressRate": bwRate, "egressBurst": kubeletBurst}}},
	}
	var pods []*nettest.Pod
	for i, s := range specs {
		p, took, err := d.addPod(d.cni, d.list, s.id, s.caps)
		if err != nil {
			return nil, err
		}
		pods = append(pods, p)
		note := fmt.Sprintf("ADD %3.0f ms", ms(took))
		if i == 0 {
			note += " (the node's first: loads and verifies the programs)"
		}
		say("%s  %-12s %-14s host veth %s  %s  %s", s.id, p.IP(4), p.IP(6), p.Result.Interfaces[0].Name, note, s.what)
	}
	out, err := nettest.Run(d.node.NS, "ip", "-o", "link")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(l); len(f) > 1 {
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			names = append(names, name)
		}
	}
	if br, err := nettest.Run(d.node.NS, "ip", "-o", "link", "show", "type", "bridge"); err != nil || strings.TrimSpace(br) != "" {
		return nil, fmt.Errorf("a bridge in the node (%v): %s", err, br)
	}
	say("the node's links: %s (veth pairs, no bridge)", strings.Join(names, " "))
	return pods, nil
}

func (d *demo) stepPodToPod(pods []*nettest.Pod) error {
	step(3, "Pod to pod: a map lookup and bpf_redirect_peer, no bridge, no netfilter")
	before, err := d.counters()
	if err != nil {
		return err
	}
	fwd, err := d.forwarded(d.node)
	if err != nil {
		return err
	}
	for _, pair := range [][2]*nettest.Pod{{pods[0], pods[1]}, {pods[1], pods[0]}} {
		a, b := pair[0], pair[1]
		for _, fam := range []int{4, 6} {
			ip := b.IP(fam)
			if o, err := nettest.Ping(a.NS, ip, 3); err != nil {
				return fmt.Errorf("ping %s -> %s: %w\n%s", a.RT.ContainerID, ip, err, o)
			}
			if err := nettest.TCP(a.NS, b.NS, ip); err != nil {
				return fmt.Errorf("TCP %s -> %s: %w", a.RT.ContainerID, ip, err)
			}
			say("%s -> %s %-12s ping 3/3, TCP echo ok", a.RT.ContainerID, b.RT.ContainerID, ip)
		}
	}
	after, err := d.counters()
	if err != nil {
		return err
	}
	fwdAfter, err := d.forwarded(d.node)
	if err != nil {
		return err
	}
	say("counter %s; the node's FORWARD chains (iptables, ip6tables): %d packets", after.since(before, "redirect"), fwdAfter-fwd)
	if fwdAfter != fwd {
		return fmt.Errorf("pod-to-pod traffic went through the node's FORWARD chain (%d packets)", fwdAfter-fwd)
	}
	return nil
}

// forwarded is the packet count of node's FORWARD chains, both families.
func (d *demo) forwarded(n *nettest.Node) (int, error) {
	total := 0
	for _, ipt := range []string{"iptables", "ip6tables"} {
		c, err := forwardPackets(n.NS, ipt)
		if err != nil {
			return 0, err
		}
		total += c
	}
	return total, nil
}

func (d *demo) stepMasquerade(p *nettest.Pod) error {
	step(4, "A pod reaches the world, masqueraded (ipMasq: true)")
	l, err := whoami(d.node.World, worldPort, "world")
	if err != nil {
		return err
	}
	defer l.Close()
	say("the world answers each connection with the address it saw; it has no route to %s or %s", podNet4, podNet6)
	before, err := d.counters()
	if err != nil {
		return err
	}
	for _, c := range []struct{ world, node net.IP }{{nettest.WorldIP4, nettest.NodeIP4}, {nettest.WorldIP6, nettest.NodeIP6}} {
		fam := 4
		if c.world.To4() == nil {
			fam = 6
		}
		answer, err := ask(p.NS, net.JoinHostPort(c.world.String(), strconv.Itoa(worldPort)))
		if err != nil {
			return fmt.Errorf("%s to the world: %w", p.RT.ContainerID, err)
		}
		say("%s %-12s -> %-24s %s", p.RT.ContainerID, p.IP(fam), net.JoinHostPort(c.world.String(), strconv.Itoa(worldPort)), answer)
		if !net.ParseIP(sawHost(answer)).Equal(c.node) {
			return fmt.Errorf("masquerade: the world saw %s, not the node's %s", sawHost(answer), c.node)
		}
	}
	after, err := d.counters()
	if err != nil {
		return err
	}
	say("masquerade ok: the world saw the node's addresses %s and %s; counters %s", nettest.NodeIP4, nettest.NodeIP6, after.since(before, "snat", "rev_snat"))
	return nil
}

func (d *demo) stepHostPort(p *nettest.Pod) error {
	step(5, "hostPort %d -> %s:%d, from the world and from the node's localhost", hostPort, p.RT.ContainerID, podPort)
	l, err := whoami(p.NS, podPort, p.RT.ContainerID)
	if err != nil {
		return err
	}
	defer l.Close()
	before, err := d.counters()
	if err != nil {
		return err
	}
	cases := []struct {
		from   string
		n      ns.NetNS
		dst    net.IP
		client net.IP // what the pod must see, when known
	}{
		{"the world", d.node.World, nettest.NodeIP4, nettest.WorldIP4},
		{"the world", d.node.World, nettest.NodeIP6, nettest.WorldIP6},
		{"the node", d.node.NS, net.ParseIP("127.0.0.1"), nil},
		{"the node", d.node.NS, net.IPv6loopback, nil},
	}
	for _, c := range cases {
		addr := net.JoinHostPort(c.dst.String(), strconv.Itoa(hostPort))
		answer, err := ask(c.n, addr)
		if err != nil {
			return fmt.Errorf("hostPort from %s: %w", c.from, err)
		}
		if !strings.HasPrefix(answer, p.RT.ContainerID+" saw ") {
			return fmt.Errorf("hostPort from %s to %s: answered %q, not by %s", c.from, addr, answer, p.RT.ContainerID)
		}
		if c.client != nil && !net.ParseIP(sawHost(answer)).Equal(c.client) {
			return fmt.Errorf("hostPort from %s: the pod saw %s, not the client %s", c.from, sawHost(answer), c.client)
		}
		say("hostPort ok: %-9s -> %-24s %s", c.from, addr, answer)
	}
	after, err := d.counters()
	if err != nil {
		return err
	}
	out, err := nettest.Run(d.node.NS, "iptables", "-t", "nat", "-S")
	if err != nil {
		return err
	}
	say("counters %s; iptables -t nat on the node: %d rules (the port is a BPF map entry)",
		after.since(before, "dnat", "rev_dnat"), strings.Count(out, "-A "))
	return nil
}

func (d *demo) stepBandwidth(free, limited *nettest.Pod) error {
	step(6, "Bandwidth: %s sends at most %d Mbit/s (runtimeConfig.bandwidth as kubelet passes it)", limited.RT.ContainerID, bwRate/1_000_000)
	r, err := nettest.Iperf(free.NS, d.node.World, nettest.WorldIP4, 5201, 1)
	if err != nil {
		return fmt.Errorf("iperf3 from %s: %w", free.RT.ContainerID, err)
	}
	say("%s (no limit)  -> the world, iperf3 1 s: %.1f Gbit/s", free.RT.ContainerID, r.BitsPerSecond/1e9)
	const secs = 3
	for try := 1; ; try++ {
		r, err = nettest.Iperf(limited.NS, d.node.World, nettest.WorldIP4, 5202, secs)
		if err != nil {
			return fmt.Errorf("iperf3 from %s: %w", limited.RT.ContainerID, err)
		}
		var each []string
		for _, v := range r.PerSecond {
			each = append(each, fmt.Sprintf("%.1f", v/1e6))
		}
		say("%s (%d Mbit/s) -> the world, iperf3 %d s: %.1f Mbit/s of TCP payload (each second: %s), %d retransmits",
			limited.RT.ContainerID, bwRate/1_000_000, secs, r.BitsPerSecond/1e6, strings.Join(each, " "), r.Retransmits)
		if within := r.BitsPerSecond >= bwRate*0.9 && r.BitsPerSecond <= bwRate*1.1; within {
			break
		}
		if try == 2 {
			return fmt.Errorf("bandwidth: %.1f Mbit/s is not within 10%% of the %d Mbit/s limit", r.BitsPerSecond/1e6, bwRate/1_000_000)
		}
		say("(not within 10%% of the limit: the machine may be busy; once more)")
	}
	say("bandwidth ok: limit %d Mbit/s, measured %.1f Mbit/s (TCP payload is ~96.5%% of the IP bytes the limit counts); paced at the source, no tbf, no ifb",
		bwRate/1_000_000, r.BitsPerSecond/1e6)
	return nil
}

func (d *demo) stepSpoof(spoofer, victim *nettest.Pod) error {
	step(7, "A spoofed packet is dropped at the pod's host veth")
	const fake = "10.244.0.250"
	if _, err := nettest.Run(spoofer.NS, "ip", "addr", "add", fake+"/32", "dev", "eth0"); err != nil {
		return err
	}
	before, err := d.counters()
	if err != nil {
		return err
	}
	if o, err := nettest.Run(spoofer.NS, "ping", "-n", "-c", "3", "-i", "0.2", "-W", "1", "-I", fake, victim.IP(4).String()); err == nil {
		return fmt.Errorf("a spoofed ping got through:\n%s", o)
	}
	after, err := d.counters()
	if err != nil {
		return err
	}
	if after["drop_spoof_src"]-before["drop_spoof_src"] < 3 {
		return fmt.Errorf("the spoofed pings were not counted as drop_spoof_src: %s", after.since(before, "drop_spoof_src"))
	}
	say("%s pings %s from %s, an address that is not its own: no reply; counter %s",
		spoofer.RT.ContainerID, victim.IP(4), fake, after.since(before, "drop_spoof_src"))
	_, err = nettest.Run(spoofer.NS, "ip", "addr", "del", fake+"/32", "dev", "eth0")
	return err
}

// stepSideBySide times ADD and DEL of pods with a hostPort and a limit,
// ebpf-cni on the demo's node and Debian's chain on a second one,
// interleaved so that both meet the same load.
func (d *demo) stepSideBySide(refList *libcni.NetworkConfigList, a, b *nettest.Pod) error {
	const n = 5
	step(8, "Side by side: Debian's bridge + host-local + portmap + bandwidth on iptables, same machine")
	refNode, err := d.newNode()
	if err != nil {
		return err
	}
	ref := nettest.NewCNI(refNode, []string{d.ref}, filepath.Join(d.tmp, "cache-ref"))
	// Two pods make the bridge and its chains (the first ADD on a node
	// costs more) and show where bridged pod-to-pod traffic goes.
	var warm []*nettest.Pod
	for i := range 2 {
		p, _, err := d.addPod(ref, refList, fmt.Sprintf("ref-warm%d", i), nil)
		if err != nil {
			return err
		}
		warm = append(warm, p)
	}
	fwdR, err := d.pingForwarded(refNode, warm[0], warm[1])
	if err != nil {
		return err
	}
	fwdE, err := d.pingForwarded(d.node, a, b)
	if err != nil {
		return err
	}
	caps := func(i int) map[string]any {
		return map[string]any{
			"portMappings": []any{map[string]any{"hostPort": 9000 + i, "containerPort": 80, "protocol": "tcp"}},
			"bandwidth":    map[string]any{"egressRate": bwRate, "egressBurst": 400_000, "ingressRate": bwRate, "ingressBurst": 400_000},
		}
	}
	var addE, addR, delE, delR []time.Duration
	var podsE, podsR []*nettest.Pod
	for i := range n {
		p, took, err := d.addPod(d.cni, d.list, fmt.Sprintf("timed%d", i), caps(i))
		if err != nil {
			return err
		}
		podsE, addE = append(podsE, p), append(addE, took)
		p, took, err = d.addPod(ref, refList, fmt.Sprintf("timed%d", i), caps(i))
		if err != nil {
			return err
		}
		podsR, addR = append(podsR, p), append(addR, took)
	}
	for i := range n {
		took, err := d.delPod(podsE[i])
		if err != nil {
			return err
		}
		delE = append(delE, took)
		if took, err = d.delPod(podsR[i]); err != nil {
			return err
		}
		delR = append(delR, took)
	}
	for _, p := range warm {
		if _, err := d.delPod(p); err != nil {
			return err
		}
	}
	say("a second simulated node runs Debian's chain (the same features); %d pods each with a hostPort and a bandwidth limit, ADDs interleaved:", n)
	say("%-44s %16s %10s", "", "bridge+iptables", "ebpf-cni")
	say("%-44s %13.0f ms %7.0f ms", "ADD, median of "+strconv.Itoa(n), medianMS(addR), medianMS(addE))
	say("%-44s %13.0f ms %7.0f ms", "DEL, median of "+strconv.Itoa(n), medianMS(delR), medianMS(delE))
	say("%-44s %16d %10d", "FORWARD chain packets, 10 pings pod to pod", fwdR, fwdE)
	say("(single figures on a shared machine move by 10-30%%; sudo make bench measures it all: docs/performance.md)")
	return nil
}

// pingForwarded pings from a to b ten times and says how many packets
// the FORWARD chains of node saw meanwhile.
func (d *demo) pingForwarded(node *nettest.Node, a, b *nettest.Pod) (int, error) {
	before, err := d.forwarded(node)
	if err != nil {
		return 0, err
	}
	if o, err := nettest.Ping(a.NS, b.IP(4), 10); err != nil {
		return 0, fmt.Errorf("ping %s -> %s: %w\n%s", a.RT.ContainerID, b.IP(4), err, o)
	}
	after, err := d.forwarded(node)
	return after - before, err
}

func (d *demo) stepCLI() error {
	step(9, "What an operator sees: ebpf-cni run without CNI_COMMAND (here in the node's netns, with the demo's --bpf-root and --state-dir)")
	for _, c := range [][]string{{"endpoints"}, {"counters"}, {"nat"}, {"ports"}, {"bandwidth"}, {"status"}} {
		out, err := d.cliOutput(c...)
		fmt.Printf("$ ebpf-cni %s\n%s", strings.Join(c, " "), out)
		if err != nil {
			return err
		}
	}
	return nil
}

// cliOutput runs the operator CLI in the node's netns on the demo's state.
func (d *demo) cliOutput(args ...string) (string, error) {
	args = append(args, "--bpf-root", d.bpfRoot, "--state-dir", d.stateDir)
	var out bytes.Buffer
	err := d.node.NS.Do(func(ns.NetNS) error {
		cmd := exec.Command(filepath.Join(d.bin, "ebpf-cni"), args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // no CNI_COMMAND: the operator CLI
		cmd.Stdout, cmd.Stderr = &out, &out
		return cmd.Run()
	})
	if err != nil {
		return out.String(), fmt.Errorf("ebpf-cni %s: %w", strings.Join(args, " "), err)
	}
	return out.String(), nil
}

func (d *demo) counters() (counters, error) {
	out, err := d.cliOutput("counters", "-o", "json")
	if err != nil {
		return nil, err
	}
	return parseCounters([]byte(out))
}
