package datapath_test

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/cli"
	"github.com/ebpf-cni/ebpf-cni/pkg/events"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// monitorRun is `ebpf-cni monitor -o json` running in the test's node.
type monitorRun struct {
	t      *testing.T
	cmd    *exec.Cmd
	lines  chan string
	stderr strings.Builder
	start  cli.MonitorStart
	events []cli.MonitorEvent // read so far
	done   chan struct{}
}

// startMonitor runs the built binary as an operator would, and waits for
// its start object (the lease is then held).
func (e *env) startMonitor(args ...string) *monitorRun {
	e.t.Helper()
	t := e.t.(*testing.T)
	m := &monitorRun{t: t, lines: make(chan string, 1<<16), done: make(chan struct{})}
	m.cmd = exec.Command(filepath.Join(e.paths[0], "ebpf-cni"), append([]string{"monitor", "-o", "json", "--bpf-root", e.bpfRoot, "--state-dir", e.stateDir}, args...)...)
	m.cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	m.cmd.Stderr = &m.stderr
	out, err := m.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, e.node.NS.Do(func(ns.NetNS) error { return m.cmd.Start() }))
	t.Cleanup(func() {
		if m.cmd.ProcessState == nil {
			_ = m.cmd.Process.Kill()
			_ = m.cmd.Wait()
		}
	})
	go func() {
		defer close(m.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			m.lines <- sc.Text()
		}
		close(m.lines)
	}()
	line := m.next(10 * time.Second)
	require.NoError(t, json.Unmarshal([]byte(line), &m.start), line)
	require.Equal(t, "start", m.start.Type, line)
	return m
}

// next is the next line of output; the test fails when none comes in time.
func (m *monitorRun) next(timeout time.Duration) string {
	m.t.Helper()
	select {
	case l, ok := <-m.lines:
		require.True(m.t, ok, "monitor ended: %s", m.stderr.String())
		return l
	case <-time.After(timeout):
		m.t.Fatalf("no output from the monitor within %s; stderr: %s", timeout, m.stderr.String())
	}
	return ""
}

// wait reads events until one satisfies ok.
func (m *monitorRun) wait(what string, ok func(*cli.MonitorEvent) bool) cli.MonitorEvent {
	m.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		line := m.next(time.Until(deadline))
		var ev cli.MonitorEvent
		require.NoError(m.t, json.Unmarshal([]byte(line), &ev), line)
		if ev.Type == "stats" {
			continue
		}
		m.events = append(m.events, ev)
		if ok(&ev) {
			return ev
		}
	}
	m.t.Fatalf("no %s event; read %+v", what, m.events)
	return cli.MonitorEvent{}
}

// stop interrupts the monitor and returns its final stats; the events it
// printed meanwhile join m.events.
func (m *monitorRun) stop() cli.MonitorStats {
	m.t.Helper()
	require.NoError(m.t, m.cmd.Process.Signal(syscall.SIGINT))
	var final cli.MonitorStats
	for line := range m.lines {
		if strings.Contains(line, `"type":"stats"`) {
			require.NoError(m.t, json.Unmarshal([]byte(line), &final), line)
			continue
		}
		var ev cli.MonitorEvent
		require.NoError(m.t, json.Unmarshal([]byte(line), &ev), line)
		m.events = append(m.events, ev)
	}
	<-m.done
	require.NoError(m.t, m.cmd.Wait(), "monitor: %s", m.stderr.String())
	require.True(m.t, final.Final, "no final stats")
	return final
}

// addK8sPod attaches a pod named ns/name through CNI_ARGS, as containerd
// does, with port mappings when given.
func (e *env) addK8sPod(list *libcni.NetworkConfigList, id, namespace, name string, ms ...map[string]any) *nettest.Pod {
	e.t.Helper()
	return e.addK8sPodCaps(list, id, namespace, name, portMappingsCaps(ms))
}

const spoofedIP = "10.244.1.250"

// TestMonitorDrops: `ebpf-cni monitor -o json` reports a spoofed packet
// (the datapath's drop) and a packet to a hostPort the pod publishes but
// does not serve (the pod's stack drops it: the kernel's no_socket), each
// with its reason, pod and addresses; a second monitor is refused while
// the first runs, and the first switches the stream off at exit.
func TestMonitorDrops(t *testing.T) {
	e := newEnv(t)
	list := e.hostPortList("", testutil.BestMode(), testutil.Cgroup(t), nil)
	spoofer := e.addK8sPod(list, "mon-spoofer", "team", "spoofer")
	web := e.addK8sPod(list, "mon-web", "team", "web", mapping(8080, 80, "tcp"))
	m := e.startMonitor("--stats", "0")

	second := exec.Command(filepath.Join(e.paths[0], "ebpf-cni"), "monitor", "--bpf-root", e.bpfRoot, "--state-dir", e.stateDir)
	var out2 []byte
	err := e.node.NS.Do(func(ns.NetNS) error { out2, _ = second.CombinedOutput(); return nil })
	require.NoError(t, err)
	require.Equal(t, cli.ExitError, second.ProcessState.ExitCode(), "%s", out2)
	require.Contains(t, string(out2), "another ebpf-cni monitor", "%s", out2)
	require.Contains(t, string(out2), fmt.Sprintf("pid %d", m.cmd.Process.Pid), "%s", out2)

	// A first ping resolves the gateway, so the spoofed one is not held
	// back by an ARP request from the spoofed address (dropped too).
	out, err := nettest.Ping(spoofer.NS, web.IP(4), 1)
	require.NoError(t, err, out)
	_, err = nettest.Run(spoofer.NS, "ip", "addr", "add", spoofedIP+"/32", "dev", "eth0")
	require.NoError(t, err)
	out, err = nettest.Run(spoofer.NS, "ping", "-n", "-c", "1", "-W", "1", "-I", spoofedIP, web.IP(4).String())
	require.Error(t, err, "spoofed ping got through: %s", out)
	ev := m.wait("drop_spoof_src", func(ev *cli.MonitorEvent) bool { return ev.Reason == "drop_spoof_src" && !ev.ARP })
	require.Equal(t, "drop", ev.Type)
	require.Equal(t, &cli.MonitorPod{Namespace: "team", Name: "spoofer"}, ev.Pod)
	require.Equal(t, "mon-spoofer", ev.ContainerID)
	require.Equal(t, "egress", ev.Direction)
	require.Equal(t, "icmp", ev.Protocol)
	require.Equal(t, spoofedIP, ev.Src)
	require.Equal(t, web.IP(4).String(), ev.Dst)
	require.WithinDuration(t, time.Now(), ev.Time, 5*time.Second)

	if !m.start.KernelDrops {
		t.Fatalf("the monitor could not trace the kernel's drops: %s", m.stderr.String())
	}
	_, err = dialFrom(e.node.World, 0, nettest.NodeIP4, 8080)
	require.Error(t, err, "the pod serves nothing on its hostPort")
	ev = m.wait("no_socket", func(ev *cli.MonitorEvent) bool { return ev.Type == "kernel-drop" && ev.DstPort == 80 })
	require.Equal(t, "no_socket", ev.Reason)
	require.Equal(t, &cli.MonitorPod{Namespace: "team", Name: "web"}, ev.Pod)
	require.Equal(t, "ingress", ev.Direction)
	require.Equal(t, "tcp", ev.Protocol)
	require.Equal(t, nettest.WorldIP4.String(), ev.Src)
	require.Equal(t, web.IP(4).String(), ev.Dst)
	require.Equal(t, "SYN", ev.TCPFlags)

	final := m.stop()
	require.Zero(t, final.Lost["drop_spoof_src"])
	c := e.eventConfig()
	require.Zero(t, c.Lease, "the monitor left the stream on")
}

// eventConfig reads entry 0 of events_config.
func (e *env) eventConfig() maps.CniEventConfig {
	e.t.Helper()
	ms, err := maps.OpenPinned(e.bpfRoot, maps.CniMapEventsConfig)
	require.NoError(e.t, err)
	defer ms[maps.CniMapEventsConfig].Close()
	var c maps.CniEventConfig
	require.NoError(e.t, ms[maps.CniMapEventsConfig].Lookup(uint32(0), &c))
	return c
}

// spoofFrame is an Ethernet frame from the pod's MAC with a source address
// that is not the pod's: UDP to dst.
func spoofFrame(src net.HardwareAddr, dst net.IP) []byte {
	f := make([]byte, 14+20+8+18)
	copy(f[0:6], []byte{0xee, 0xee, 0xee, 0xee, 0xee, 0xee})
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:], unix.ETH_P_IP)
	ip := f[14:34]
	ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(ip[2:], uint16(len(f)-14))
	copy(ip[12:16], net.ParseIP(spoofedIP).To4())
	copy(ip[16:20], dst.To4())
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	sum = sum>>16 + sum&0xffff
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum+sum>>16))
	binary.BigEndian.PutUint16(f[34:], 40000)
	binary.BigEndian.PutUint16(f[36:], 9)
	binary.BigEndian.PutUint16(f[38:], 8+18)
	return f
}

// flood sends n spoofed frames from the pod's eth0 through a packet socket.
func flood(t *testing.T, p *nettest.Pod, dst net.IP, n int) {
	t.Helper()
	var fd int
	var frame []byte
	var sll unix.SockaddrLinklayer
	require.NoError(t, p.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		frame = spoofFrame(l.Attrs().HardwareAddr, dst)
		sll = unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: l.Attrs().Index, Halen: 6}
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		return err
	}))
	defer unix.Close(fd)
	// The socket skips the pod's qdisc: every frame reaches the veth.
	require.NoError(t, unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1))
	// A netkit pod's program runs in its own transmit: a frame it drops
	// fails the send (ENOBUFS, from NET_XMIT_DROP), and nothing queues.
	netkit := testutil.PodDevice() == "netkit"
	for i := 0; i < n; i++ {
		if err := unix.Sendto(fd, frame, 0, &sll); err != nil {
			if netkit && err == unix.ENOBUFS {
				continue
			}
			if err == unix.ENOBUFS || err == unix.EAGAIN {
				i--
				continue
			}
			require.NoError(t, err, "frame %d", i)
		}
	}
}

func htons(v uint16) uint16 { return v>>8 | v<<8 }

// TestMonitorFlood: a million spoofed packets (50,000 under emulation) while the monitor reads
// yield no more events than the rate limit lets through (rate x seconds x
// CPUs, plus a burst per CPU), and events + suppressed + lost is exactly
// the number of drop_spoof_src drops node_counters counted meanwhile.
func TestMonitorFlood(t *testing.T) {
	const rate, burst = 1000, 100
	total := 1_000_000
	if testutil.Emulated() { // qemu without KVM (make test-kernel): the same checks on fewer frames
		total = 50_000
	}
	e := newEnv(t)
	list := e.confList(netOpts{})
	a := e.addK8sPod(list, "flooder", "team", "flooder")
	b := e.addPod(list, "target")
	m := e.startMonitor("--stats", "0", "--rate", "1000", "--burst", "100", "--kernel-drops=false")
	reason := int(maps.CniPktReasonREASON_DROP_SPOOF_SRC)
	before := e.counters()[reason]
	began := time.Now()
	flood(t, a, b.IP(4), total)
	sent := time.Since(began)
	dropped := e.counters()[reason] - before
	final := m.stop()
	elapsed := time.Since(began)
	t.Logf("%d frames sent in %s: %d dropped as spoofed, %d events, %d suppressed, %d lost", total, sent.Round(time.Millisecond),
		dropped, len(m.events), final.Suppressed["drop_spoof_src"], final.Lost["drop_spoof_src"])
	require.Less(t, sent, time.Minute)
	require.Equal(t, uint64(total), dropped, "every frame is dropped as spoofed")

	var got uint64
	for _, ev := range m.events {
		if ev.Reason == "drop_spoof_src" {
			require.Equal(t, "team", ev.Pod.Namespace)
			got++
		}
	}
	cpus := uint64(runtime.NumCPU())
	bound := uint64(rate*elapsed.Seconds()+1)*cpus + burst*cpus
	require.Greater(t, got, uint64(0))
	require.LessOrEqual(t, got, bound, "events within the rate limit over %s", elapsed)
	require.Equal(t, dropped, got+final.Suppressed["drop_spoof_src"]+final.Lost["drop_spoof_src"],
		"events + suppressed + lost == drops")
}

// TestMonitorLeaseExpires: a monitor killed without a chance to clean up
// leaves its lease behind; once it has expired, no drop is reported and
// the datapath clears it.
func TestMonitorLeaseExpires(t *testing.T) {
	e := newEnv(t)
	list := e.confList(netOpts{})
	a := e.addPod(list, "expirer")
	b := e.addPod(list, "target")
	m := e.startMonitor("--stats", "0", "--kernel-drops=false")
	require.NoError(t, m.cmd.Process.Kill())
	_ = m.cmd.Wait()
	require.NotZero(t, e.eventConfig().Lease, "a killed monitor's lease stays until it expires")
	time.Sleep(events.LeaseTime + 500*time.Millisecond)

	ms, err := maps.OpenPinned(e.bpfRoot, events.Maps...)
	require.NoError(t, err)
	defer func() {
		for _, m := range ms {
			m.Close()
		}
	}()
	s, err := events.Open(ms[maps.CniMapEvents], ms[maps.CniMapEventsConfig], ms[maps.CniMapEventsStats], maps.Dir(e.bpfRoot))
	require.NoError(t, err, "the killed monitor's lock went with it")
	defer s.Close()
	var stats0 []maps.CniEventStats
	require.NoError(t, ms[maps.CniMapEventsStats].Lookup(uint32(0), &stats0))

	reason := int(maps.CniPktReasonREASON_DROP_SPOOF_SRC)
	before := e.counters()[reason]
	flood(t, a, b.IP(4), 100)
	require.Equal(t, uint64(100), e.counters()[reason]-before)
	_, err = s.Read(time.Now().Add(500 * time.Millisecond))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "an event after the lease expired")
	require.Zero(t, e.eventConfig().Lease, "the datapath clears an expired lease")
	var stats1 []maps.CniEventStats
	require.NoError(t, ms[maps.CniMapEventsStats].Lookup(uint32(0), &stats1))
	require.Equal(t, stats0, stats1, "nothing suppressed or lost either: the stream was off")
}

// TestMonitorFlows: with --flows --sample 1, a TCP connection between two
// pods is reported as a flow start (the client's SYN) and an end (a FIN).
func TestMonitorFlows(t *testing.T) {
	e := newEnv(t)
	list := e.confList(netOpts{})
	client := e.addK8sPod(list, "flow-client", "team", "client")
	server := e.addK8sPod(list, "flow-server", "team", "server")
	m := e.startMonitor("--stats", "0", "--flows", "--sample", "1", "--kernel-drops=false")
	require.True(t, m.start.Flows)
	l, err := nettest.ListenPort(server.NS, server.IP(4), 7777)
	require.NoError(t, err)
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			nettest.EchoConn(c)
		}
	}()
	c, err := dialFrom(client.NS, 0, server.IP(4), 7777)
	require.NoError(t, err)
	port := uint16(c.LocalAddr().(*net.TCPAddr).Port)
	c.Close()
	ours := func(ev *cli.MonitorEvent) bool {
		return ev.Src == client.IP(4).String() && ev.SrcPort == port && ev.Dst == server.IP(4).String() && ev.DstPort == 7777
	}
	start := m.wait("flow-start", func(ev *cli.MonitorEvent) bool { return ev.Type == "flow-start" && ours(ev) })
	require.Equal(t, &cli.MonitorPod{Namespace: "team", Name: "client"}, start.Pod)
	require.Equal(t, "SYN", start.TCPFlags)
	require.Equal(t, "egress", start.Direction)
	end := m.wait("flow-end", func(ev *cli.MonitorEvent) bool { return ev.Type == "flow-end" && ours(ev) })
	require.Contains(t, end.TCPFlags, "FIN")
	final := m.stop()
	require.Zero(t, final.FlowSuppressed)
}
