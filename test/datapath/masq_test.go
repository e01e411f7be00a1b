package datapath_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/cluster"
	"github.com/ebpf-cni/ebpf-cni/pkg/conntrack"
	"github.com/ebpf-cni/ebpf-cni/pkg/counters"
	"github.com/ebpf-cni/ebpf-cni/pkg/flows"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/uplink"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// worldServer is a host outside the node: it echoes TCP and UDP on one
// port and records the source address of everything it gets, ICMP echo
// requests included.
type worldServer struct {
	port int
	tcp  net.Listener
	udp  net.PacketConn
	icmp []int // raw sockets, v4 and v6
	mu   sync.Mutex
	seen map[string][]netip.AddrPort // "tcp", "udp", "icmp"
}

func newWorldServer(t *testing.T, world ns.NetNS) *worldServer { return newServer(t, world, 0) }

// newServer is a worldServer in netns n on port (0: any free port).
func newServer(t *testing.T, n ns.NetNS, port int) *worldServer {
	t.Helper()
	s := &worldServer{seen: map[string][]netip.AddrPort{}}
	require.NoError(t, n.Do(func(ns.NetNS) error {
		var err error
		if s.tcp, err = net.Listen("tcp", fmt.Sprintf(":%d", port)); err != nil {
			return err
		}
		s.port = s.tcp.Addr().(*net.TCPAddr).Port
		if s.udp, err = net.ListenPacket("udp", fmt.Sprintf(":%d", s.port)); err != nil {
			return err
		}
		for _, fp := range [][2]int{{unix.AF_INET, unix.IPPROTO_ICMP}, {unix.AF_INET6, unix.IPPROTO_ICMPV6}} {
			fd, err := unix.Socket(fp[0], unix.SOCK_RAW, fp[1])
			if err != nil {
				return err
			}
			_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 200000})
			s.icmp = append(s.icmp, fd)
		}
		return nil
	}))
	done := make(chan struct{})
	t.Cleanup(func() {
		close(done)
		s.tcp.Close()
		s.udp.Close()
	})
	go func() {
		for {
			c, err := s.tcp.Accept()
			if err != nil {
				return
			}
			s.record("tcp", c.RemoteAddr())
			go nettest.EchoConn(c)
		}
	}()
	go func() {
		buf := make([]byte, 2048)
		for {
			k, from, err := s.udp.ReadFrom(buf)
			if err != nil {
				return
			}
			s.record("udp", from)
			_, _ = s.udp.WriteTo(buf[:k], from)
		}
	}()
	for _, fd := range s.icmp {
		go func(fd int) {
			defer unix.Close(fd)
			buf := make([]byte, 2048)
			for {
				select {
				case <-done:
					return
				default:
				}
				k, from, err := unix.Recvfrom(fd, buf, 0)
				if err != nil || k < 1 {
					continue
				}
				var ip net.IP
				switch sa := from.(type) {
				case *unix.SockaddrInet4:
					ip = net.IP(sa.Addr[:])
					if k < 21 || buf[(buf[0]&0xf)*4] != 8 { // echo request after the IPv4 header
						continue
					}
				case *unix.SockaddrInet6:
					ip = net.IP(sa.Addr[:])
					if buf[0] != 128 {
						continue
					}
				}
				s.record("icmp", &net.IPAddr{IP: ip})
			}
		}(fd)
	}
	return s
}

func (s *worldServer) record(proto string, a net.Addr) {
	var ap netip.AddrPort
	switch v := a.(type) {
	case *net.TCPAddr:
		ap = v.AddrPort()
	case *net.UDPAddr:
		ap = v.AddrPort()
	case *net.IPAddr:
		ip, _ := netip.AddrFromSlice(v.IP)
		ap = netip.AddrPortFrom(ip, 0)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen[proto] = append(s.seen[proto], netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()))
}

// sources lists the distinct source addresses seen for proto.
func (s *worldServer) sources(proto string) map[netip.Addr]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[netip.Addr]bool{}
	for _, ap := range s.seen[proto] {
		out[ap.Addr()] = true
	}
	return out
}

func (s *worldServer) last(proto string) netip.AddrPort {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.seen[proto]
	if len(l) == 0 {
		return netip.AddrPort{}
	}
	return l[len(l)-1]
}

// dialFrom opens a TCP connection from the pod, from a fixed local port
// when lport is not 0, and checks an echo through it.
func dialFrom(p ns.NetNS, lport int, dst net.IP, port int) (net.Conn, error) {
	var c net.Conn
	err := p.Do(func(ns.NetNS) error {
		d := net.Dialer{Timeout: 3 * time.Second, LocalAddr: &net.TCPAddr{Port: lport}}
		var err error
		c, err = d.Dial("tcp", net.JoinHostPort(dst.String(), strconv.Itoa(port)))
		return err
	})
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := nettest.Echo(c, "through the masquerade\n"); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// udpFrom sends one datagram from the pod (from lport when not 0) and
// waits for the echo.
func udpFrom(p ns.NetNS, lport int, dst net.IP, port int) error {
	return p.Do(func(ns.NetNS) error {
		c, err := net.DialUDP("udp", &net.UDPAddr{Port: lport}, &net.UDPAddr{IP: dst, Port: port})
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 64)
		for try := 0; try < 3; try++ {
			if _, err := c.Write([]byte("ping")); err != nil {
				return err
			}
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			if _, err := c.Read(buf); err == nil {
				return nil
			}
		}
		return errors.New("no UDP echo")
	})
}

func (e *env) masqList(version, mode string, extra map[string]any) *libcni.NetworkConfigList {
	x := map[string]any{"ipMasq": true}
	for k, v := range extra {
		x[k] = v
	}
	return e.confList(netOpts{version: version, attachMode: mode, extra: x})
}

// forwarded is the node stack's ForwDatagrams (IPv4): what went through
// its routing and FORWARD path.
func (e *env) forwarded() int { return snmp(e.t, e.node.NS, "ForwDatagrams") }

// flows lists the NAT table's flows.
func (e *env) flows() []conntrack.Flow {
	e.t.Helper()
	n := e.handle()
	defer n.Close()
	t, err := conntrack.Open(n)
	require.NoError(e.t, err)
	f, err := t.Flows()
	require.NoError(e.t, err)
	return f
}

func (e *env) natEntries() int { return len(e.flows()) }

// tableEntries counts the entries of the pod of addresses ips in the NAT
// table (every direction) and in the flow table.
func (e *env) tableEntries(ips ...net.IP) int {
	e.t.Helper()
	n := e.handle()
	defer n.Close()
	has := func(ip net.IP) bool {
		for _, x := range ips {
			if x.Equal(ip) {
				return true
			}
		}
		return false
	}
	nat, err := conntrack.Open(n)
	require.NoError(e.t, err)
	c, err := nat.Count(func(_ uint8, pod net.IP) bool { return has(pod) })
	require.NoError(e.t, err)
	ft, err := flows.Open(n)
	require.NoError(e.t, err)
	fs, err := ft.List()
	require.NoError(e.t, err)
	for _, f := range fs {
		if has(f.Pod) {
			c++
		}
	}
	return c
}

// uplinkProgramIDs lists what runs on the node's uplink, both directions.
func (e *env) uplinkProgramIDs() int {
	e.t.Helper()
	n := 0
	require.NoError(e.t, e.node.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("uplink")
		if err != nil {
			return err
		}
		for _, h := range uplink.Hooks {
			ids, err := attach.AttachedIDs(l, h)
			if err != nil {
				return err
			}
			n += len(ids)
		}
		return nil
	}))
	return n
}

var addr = func(ip net.IP) netip.Addr { a, _ := netip.AddrFromSlice(ip); return a.Unmap() }

// TestMasquerade is the must-hold case, under every spec version and both
// attach modes: a host outside the node, with no route to the pods, sees
// the node's address for TCP, UDP and ping from pods, IPv4 and IPv6; the
// replies reach the pods without the node's FORWARD path; no netfilter rule
// exists; DEL takes the pods' flows and, with the last pod, the uplink
// programs.
func TestMasquerade(t *testing.T) {
	for _, v := range testutil.SpecVersions {
		for _, mode := range testutil.AttachModes {
			t.Run(v+"/"+mode, func(t *testing.T) {
				testutil.RequireMode(t, mode)
				testMasquerade(t, v, mode)
			})
		}
	}
}

func testMasquerade(t *testing.T, version, mode string) {
	e := newEnv(t)
	list := e.masqList(version, mode, nil)
	rules := e.ruleset()
	a := e.addPod(list, "masq-a")
	b := e.addPod(list, "masq-b")
	require.Equal(t, 2, e.uplinkProgramIDs(), "from_netdev and to_netdev on the uplink")
	srv := newWorldServer(t, e.node.World)
	fwd := e.forwarded()
	before, err := counters.ReadCounters(e.bpfRoot)
	require.NoError(t, err)

	for _, p := range []*nettest.Pod{a, b} {
		for _, dst := range []net.IP{nettest.WorldIP4, nettest.WorldIP6} {
			c, err := dialFrom(p.NS, 0, dst, srv.port)
			require.NoError(t, err, "TCP to %s", dst)
			c.Close()
			require.NoError(t, udpFrom(p.NS, 0, dst, srv.port), "UDP to %s", dst)
			out, err := nettest.Ping(p.NS, dst, 2)
			require.NoError(t, err, "ping %s: %s", dst, out)
		}
	}
	// A conversation on one connection: every one of the pod's packets
	// leaves translated and is counted so on the uplink, whichever program
	// translated it (from_container does, for a flow's packets in the
	// second of its last one: bpf/lib/conntrack.h, nat_established).
	for _, dst := range []net.IP{nettest.WorldIP4, nettest.WorldIP6} {
		c, err := dialFrom(a.NS, 0, dst, srv.port)
		require.NoError(t, err, "TCP to %s", dst)
		mid, err := counters.ReadCounters(e.bpfRoot)
		require.NoError(t, err)
		for i := 0; i < 20; i++ {
			require.NoError(t, nettest.Echo(c, "again\n"), "echo %d to %s", i, dst)
		}
		end, err := counters.ReadCounters(e.bpfRoot)
		require.NoError(t, err)
		c.Close()
		snat := maps.CniPktReasonREASON_SNAT
		require.GreaterOrEqual(t, end[snat].Packets-mid[snat].Packets, uint64(20), "the pod's packets to %s counted translated on the uplink", dst)
	}
	node := map[netip.Addr]bool{addr(nettest.NodeIP4): true, addr(nettest.NodeIP6): true}
	for _, proto := range []string{"tcp", "udp", "icmp"} {
		require.Equal(t, node, srv.sources(proto), "%s sources seen outside the node", proto)
	}
	after, err := counters.ReadCounters(e.bpfRoot)
	require.NoError(t, err)
	rev := maps.CniPktReasonREASON_REV_SNAT
	require.GreaterOrEqual(t, after[rev].Packets-before[rev].Packets, uint64(16), "replies translated on the uplink")
	require.GreaterOrEqual(t, after[maps.CniPktReasonREASON_SNAT].Packets-before[maps.CniPktReasonREASON_SNAT].Packets, uint64(16))
	// The first packet of each TCP and UDP flow goes through the stack, so
	// that netfilter (kube-proxy) sees it (bpf/lib/flow.h): 2 pods x (TCP,
	// UDP) over IPv4. Everything after it, and every reply, takes the fast
	// path.
	flowsV4 := 4
	require.Less(t, e.forwarded()-fwd, flowsV4+4, "pod traffic went through the node's FORWARD path")
	newFlows := maps.CniPktReasonREASON_FLOW_NEW
	require.GreaterOrEqual(t, after[newFlows].Packets-before[newFlows].Packets, uint64(2*flowsV4), "first packets handed to netfilter, IPv4 and IPv6")
	require.Equal(t, rules, e.ruleset(), "ADD changed the netfilter ruleset")
	out, err := nettest.Run(e.node.NS, "iptables-save")
	require.NoError(t, err)
	require.NotContains(t, out, "MASQUERADE")

	for _, f := range e.flows() {
		require.True(t, f.NAT.Equal(nettest.NodeIP4) || f.NAT.Equal(nettest.NodeIP6), "flow translated to %s", f.NAT)
	}
	require.NotZero(t, e.tableEntries(a.IP(4), a.IP(6)))
	require.NoError(t, e.cni.DelPod(list, a))
	for _, f := range e.flows() {
		require.False(t, f.Pod.Equal(a.IP(4)) || f.Pod.Equal(a.IP(6)), "DEL left a flow of the pod: %+v", f)
	}
	require.Zero(t, e.tableEntries(a.IP(4), a.IP(6)), "DEL left entries of the pod (NAT, in any direction, or flows)")
	require.NotZero(t, e.natEntries(), "the other pod's flows stay")
	require.Equal(t, 2, e.uplinkProgramIDs(), "the uplink keeps its programs while pods remain")
	require.NoError(t, e.cni.DelPod(list, b))
	require.Empty(t, e.flows(), "flows left after the last DEL")
	require.Zero(t, e.uplinkProgramIDs(), "the last DEL takes the programs off the uplink")
	e.requireClean()
}

// TestMasqueradeLongNetworkName: a network name of 128 bytes or more does
// not fit ipam_nets; ebpf-ipam and masquerade register it through the one
// network registry (maps.RegisterNetwork), as "sha256:<hex>" both, so ADD
// with ipMasq works and the pod's traffic leaves masqueraded. (Masquerade
// had truncated the name instead: ADD failed with code 118, "has the same
// map key as network sha256:...".)
func TestMasqueradeLongNetworkName(t *testing.T) {
	e := newEnv(t)
	name := strings.Repeat("long-network-name-", 8)[:130]
	list := e.confList(netOpts{name: name, extra: map[string]any{"ipMasq": true}})
	p := e.addPod(list, "long-name")
	srv := newWorldServer(t, e.node.World)
	c, err := dialFrom(p.NS, 0, nettest.WorldIP4, srv.port)
	require.NoError(t, err)
	c.Close()
	require.Equal(t, map[netip.Addr]bool{addr(nettest.NodeIP4): true}, srv.sources("tcp"))

	m, err := maps.OpenPinned(e.bpfRoot, maps.CniMapIpamNets)
	require.NoError(t, err)
	defer m[maps.CniMapIpamNets].Close()
	var v maps.CniIpamNet
	require.NoError(t, m[maps.CniMapIpamNets].Lookup(maps.NetID(name), &v))
	require.Equal(t, maps.Fit(name, maps.CniNetNameLen), maps.GoString(v.Name[:]))
	require.True(t, strings.HasPrefix(maps.GoString(v.Name[:]), "sha256:"))

	require.NoError(t, e.cni.DelPod(list, p))
	e.requireClean()
}

// TestMasqueradeSamePort: two pods use one source port to one server at
// once, over TCP and UDP, IPv4 and IPv6: both get through, one keeps its
// port and the other moves into the range above the node's ephemeral
// ports. A connection of the node's own from that port is not hijacked.
func TestMasqueradeSamePort(t *testing.T) {
	e := newEnv(t)
	list := e.masqList("1.1.0", "", nil)
	a := e.addPod(list, "same-a")
	b := e.addPod(list, "same-b")
	srv := newWorldServer(t, e.node.World)
	for i, dst := range []net.IP{nettest.WorldIP4, nettest.WorldIP6} {
		lport := 40000 + 10*i // a closed connection holds its port in TIME_WAIT
		// The node's own connection from lport comes first.
		nodeConn, err := dialFrom(e.node.NS, lport, dst, srv.port)
		require.NoError(t, err)
		ca, err := dialFrom(a.NS, lport, dst, srv.port)
		require.NoError(t, err, "pod a, TCP from port %d to %s", lport, dst)
		pa := srv.last("tcp")
		cb, err := dialFrom(b.NS, lport, dst, srv.port)
		require.NoError(t, err, "pod b, TCP from port %d to %s", lport, dst)
		pb := srv.last("tcp")
		require.Equal(t, addr(dst.To16()).Is4(), pa.Addr().Is4())
		ports := map[uint16]bool{uint16(lport): true, pa.Port(): true, pb.Port(): true}
		require.Len(t, ports, 3, "node, pod a and pod b share no port: %v %v", pa, pb)
		for _, p := range []uint16{pa.Port(), pb.Port()} {
			require.GreaterOrEqual(t, p, uint16(61000), "a moved port comes from above the ephemeral range")
		}
		// Every connection still works, at once.
		for _, c := range []net.Conn{nodeConn, ca, cb} {
			require.NoError(t, nettest.Echo(c, "still mine\n"))
			c.Close()
		}

		require.NoError(t, udpFrom(a.NS, lport+1, dst, srv.port))
		ua := srv.last("udp")
		require.NoError(t, udpFrom(b.NS, lport+1, dst, srv.port))
		ub := srv.last("udp")
		require.Equal(t, uint16(lport+1), ua.Port(), "a free port is kept")
		require.NotEqual(t, ua.Port(), ub.Port())
		require.True(t, ua.Addr() == ub.Addr() && (ua.Addr() == addr(nettest.NodeIP4) || ua.Addr() == addr(nettest.NodeIP6)))
	}

	// The operator CLI shows the flows: both pods' UDP flows from one port,
	// one kept, one moved.
	out, err := nettest.Run(e.node.NS, filepath.Join(e.paths[0], "ebpf-cni"), "nat", "-o", "json", "--bpf-root", e.bpfRoot, "--pod", b.IP(4).String())
	require.NoError(t, err, out)
	var flows []struct {
		Proto   string `json:"proto"`
		PodPort int    `json:"podPort"`
		NAT     string `json:"nat"`
		NATPort int    `json:"natPort"`
		Kept    bool   `json:"kept"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &flows), out)
	found := false
	for _, f := range flows {
		if f.Proto == "udp" && f.PodPort == 40001 {
			found = true
			require.Equal(t, nettest.NodeIP4.String(), f.NAT)
			require.False(t, f.Kept, "pod b's port moved: %s", out)
			require.GreaterOrEqual(t, f.NATPort, 61000)
		}
	}
	require.True(t, found, "ebpf-cni nat lists pod b's UDP flow: %s", out)
}

// TestMasqueradeKeptPortNodeLater: a pod's flow kept its port; once the
// pod closed it (its entry lives on, closing), a connection of the node's
// own from the same port to the same server works, TCP and UDP, IPv4 and
// IPv6: its replies reach the node's socket, not the pod (from_netdev looks
// for a socket of the node at every reply of a flow that kept its port).
func TestMasqueradeKeptPortNodeLater(t *testing.T) {
	e := newEnv(t)
	list := e.masqList("1.1.0", "", nil)
	p := e.addPod(list, "node-later")
	srv := newWorldServer(t, e.node.World)
	for i, dst := range []net.IP{nettest.WorldIP4, nettest.WorldIP6} {
		lport := 41000 + 10*i
		c, err := dialFrom(p.NS, lport, dst, srv.port)
		require.NoError(t, err)
		require.Equal(t, uint16(lport), srv.last("tcp").Port(), "the pod's port is kept")
		c.Close() // the pod closes first: its socket waits in TIME_WAIT
		require.NoError(t, udpFrom(p.NS, lport, dst, srv.port))
		require.Equal(t, uint16(lport), srv.last("udp").Port())

		kept := 0
		for _, f := range e.flows() {
			if f.Pod.Equal(p.IP(4)) || f.Pod.Equal(p.IP(6)) {
				if f.PodPort == uint16(lport) && f.Remote.Equal(dst) && f.Kept && !f.Expired {
					kept++
				}
			}
		}
		require.Equal(t, 2, kept, "the pod's TCP and UDP flows hold port %d", lport)

		node, err := dialFrom(e.node.NS, lport, dst, srv.port)
		require.NoError(t, err, "the node's TCP from port %d to %s", lport, dst)
		require.NoError(t, nettest.Echo(node, "the node's own\n"))
		node.Close()
		require.NoError(t, udpFrom(e.node.NS, lport, dst, srv.port), "the node's UDP from port %d to %s", lport, dst)
	}
}

// TestMasqueradeExpiry: with a one-second UDP lifetime, a port held by one
// pod's flow is free again once the flow expired; GC deletes expired flows.
func TestMasqueradeExpiry(t *testing.T) {
	e := newEnv(t)
	list := e.masqList("1.1.0", "", map[string]any{"natTimeouts": map[string]any{"udp": "1s"}})
	a := e.addPod(list, "exp-a")
	b := e.addPod(list, "exp-b")
	srv := newWorldServer(t, e.node.World)
	const lport = 5353
	require.NoError(t, udpFrom(a.NS, lport, nettest.WorldIP4, srv.port))
	require.Equal(t, uint16(lport), srv.last("udp").Port())
	require.NoError(t, udpFrom(b.NS, lport, nettest.WorldIP4, srv.port))
	require.NotEqual(t, uint16(lport), srv.last("udp").Port(), "pod a's live flow holds the port")
	require.Len(t, e.flows(), 2)

	time.Sleep(2500 * time.Millisecond)
	for _, f := range e.flows() {
		require.True(t, f.Expired, "flow %v:%d outlived its lifetime", f.Pod, f.PodPort)
	}
	require.NoError(t, udpFrom(b.NS, lport, nettest.WorldIP4, srv.port))
	require.Equal(t, uint16(lport), srv.last("udp").Port(), "the expired flow gave the port back")

	require.NoError(t, e.cni.GC(list, []types.GCAttachment{{ContainerID: "exp-a", IfName: "eth0"}, {ContainerID: "exp-b", IfName: "eth0"}}))
	fl := e.flows()
	require.Len(t, fl, 1, "GC keeps the live flow only: %+v", fl)
	require.True(t, fl[0].Pod.Equal(b.IP(4)))
}

// TestMasqueradePMTU: a router beyond the node has a narrower link; its
// ICMP "fragmentation needed" / "packet too big" about a masqueraded flow
// reaches the pod translated, and path-MTU discovery works over TCP, IPv4
// and IPv6.
func TestMasqueradePMTU(t *testing.T) {
	e := newEnv(t)
	list := e.masqList("1.1.0", "", nil)
	p := e.addPod(list, "pmtu")
	far4, far6 := net.ParseIP("203.0.113.2"), net.ParseIP("2001:db8:fa::2")
	far := farHost(t, e.node.World, far4, far6)
	for _, dst := range []net.IP{far4, far6} {
		l, err := nettest.Listen(far, dst)
		require.NoError(t, err)
		defer l.Close()
		c, err := dialFrom(p.NS, 0, dst, l.Addr().(*net.TCPAddr).Port)
		require.NoError(t, err)
		// 256 KiB in full-sized segments: they only get through once the
		// pod learnt the 1280-byte path MTU from the translated ICMP error.
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		require.NoError(t, nettest.Echo(c, strings.Repeat("x", 256<<10)), "bulk TCP to %s", dst)
		c.Close()
		out, err := nettest.Run(p.NS, "ip", "route", "get", dst.String())
		require.NoError(t, err)
		require.Contains(t, out, "mtu 1280", "the pod cached the path MTU to %s", dst)
	}
	out, err := nettest.Run(p.NS, "ping", "-n", "-c", "1", "-W", "2", "-M", "do", "-s", "1400", far4.String())
	require.Error(t, err, "ping -M do -s 1400 must not fit: %s", out)
	require.Contains(t, out, "1280", "the pod knows the path MTU")
}

// farHost is a host two hops out: world forwards to it over a link whose
// MTU is 1280 on the world's side.
func farHost(t *testing.T, world ns.NetNS, ip4, ip6 net.IP) ns.NetNS {
	t.Helper()
	far, err := nettest.NewNetNS()
	require.NoError(t, err)
	t.Cleanup(func() { nettest.CloseNetNS(far) })
	run := func(n ns.NetNS, args ...string) {
		t.Helper()
		out, err := nettest.Run(n, args[0], args[1:]...)
		require.NoError(t, err, out)
	}
	run(world, "ip", "link", "add", "narrow", "mtu", "1280", "type", "veth", "peer", "name", "wide", "netns", far.Path())
	run(world, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	// No DAD on the new link: a tentative link-local address sends no
	// neighbour solicitation, and the first packets would wait it out.
	run(world, "sysctl", "-qw", "net.ipv6.conf.narrow.accept_dad=0")
	run(far, "sysctl", "-qw", "net.ipv6.conf.wide.accept_dad=0")
	run(world, "ip", "link", "set", "narrow", "up")
	run(world, "ip", "addr", "add", "203.0.113.1/24", "dev", "narrow")
	run(world, "ip", "addr", "add", "2001:db8:fa::1/64", "dev", "narrow", "nodad")
	run(far, "ip", "link", "set", "wide", "up")
	run(far, "ip", "addr", "add", ip4.String()+"/24", "dev", "wide")
	run(far, "ip", "addr", "add", ip6.String()+"/64", "dev", "wide", "nodad")
	// far's own packets must fit the narrow link too: oversized frames
	// into a veth are dropped without an ICMP error, so far's echo got
	// through only while its TCP sent GSO packets (it did on 6.18, not
	// always on 6.1). It still advertises a full-sized MSS, so the pod's
	// segments need the path MTU learnt from the translated ICMP error.
	run(far, "ip", "route", "add", "default", "via", "203.0.113.1", "mtu", "1280", "advmss", "1460")
	run(far, "ip", "-6", "route", "add", "default", "via", "2001:db8:fa::1", "mtu", "1280", "advmss", "1440")
	return far
}

// TestMasqueradeBadConfig: every bad masquerade key is refused with code 7
// naming it, and leaves nothing: no veth, no map entry, no pinned link, no
// uplink program, no allocated address.
func TestMasqueradeBadConfig(t *testing.T) {
	e := newEnv(t)
	cases := []struct {
		name, key string
		extra     map[string]any
	}{
		{"masqueradeIP", "masqueradeIP", map[string]any{"masqueradeIP": "not-an-ip"}},
		// Not the node's: replies would go nowhere, for every pod of the
		// network, also after this ADD's DEL.
		{"masqueradeIP not the node's", "masqueradeIP", map[string]any{"masqueradeIP": "10.77.0.200"}},
		{"masqueradeIP the world's", "masqueradeIP", map[string]any{"masqueradeIP": nettest.WorldIP6.String()}},
		{"nonMasqueradeCIDRs[1]", "nonMasqueradeCIDRs[1]", map[string]any{"nonMasqueradeCIDRs": []string{"10.0.0.0/8", "10.1/33"}}},
		{"masqueradePortRange", "masqueradePortRange", map[string]any{"masqueradePortRange": "40000-50000"}}, // inside the ephemeral ports
		{"natTimeouts.udp", "natTimeouts.udp", map[string]any{"natTimeouts": map[string]any{"udp": "0s"}}},
		{"natTimeouts.tcpFoo", "natTimeouts.tcpFoo", map[string]any{"natTimeouts": map[string]any{"tcpFoo": "1m"}}},
		{"uplinks[0]", "uplinks[0]", map[string]any{"uplinks": []string{"nosuchdev"}}},
	}
	for _, tc := range cases {
		key, extra := tc.key, tc.extra
		t.Run(tc.name, func(t *testing.T) {
			list := e.masqList("1.1.0", "", extra)
			p, err := e.cni.AddPod(list, "bad-masq-config", nil)
			if err == nil { // the bug: not left for the next case
				require.NoError(t, e.cni.DelPod(list, p))
			}
			require.Error(t, err)
			var ce *types.Error
			require.ErrorAs(t, err, &ce)
			require.Equal(t, uint(types.ErrInvalidNetworkConfig), ce.Code, ce.Msg)
			require.Contains(t, ce.Msg, key)
			e.requireClean()
			require.Zero(t, e.uplinkProgramIDs())
			allocs, err := os.ReadDir(filepath.Join(e.stateDir, "ipam", "ebpfnet", "owners"))
			if err == nil {
				require.Empty(t, allocs, "an address stayed allocated")
			}
		})
	}
	// The uplinks case got as far as IPAM: its allocation was released,
	// and with it the network's ebpf-ipam state (it held nothing else).
	_, err := os.Stat(filepath.Join(e.stateDir, "ipam", "ebpfnet"))
	require.ErrorIs(t, err, os.ErrNotExist)

	t.Run("masqueradeIP disagrees with the network's", func(t *testing.T) { testMasqueradeIPDisagrees(t, e) })

	// An uplink that is a device of ebpf-cni's own: a pod's host veth (the
	// uplink programs stayed on it after the pod's DEL in tcx mode, and
	// status blamed the pod) or the cluster's VXLAN device. Refused, and
	// nothing lands on either.
	overlay := map[string]any{"clusterCIDRs": []string{nettest.ClusterCIDR4.String(), nettest.ClusterCIDR6.String()}, "overlay": "vxlan"}
	for _, mode := range testutil.AttachModes {
		for _, tc := range []struct {
			name string
			keys map[string]any // of the pod that makes the device
			dev  string
		}{
			{"a pod's host veth", nil, veth.HostName("victim", "eth0")},
			{"the VXLAN device", overlay, cluster.Device},
		} {
			t.Run("uplinks[1] "+tc.name+"/"+mode, func(t *testing.T) {
				testutil.RequireMode(t, mode)
				list := e.masqList("1.1.0", mode, tc.keys)
				victim := testutil.AddPod(t, e.cni, list, "victim")
				before := e.deviceProgramIDs(tc.dev)
				bad := map[string]any{"uplinks": []string{"uplink", tc.dev}}
				for k, v := range tc.keys {
					bad[k] = v
				}
				badList := e.masqList("1.1.0", mode, bad)
				p, err := e.cni.AddPod(badList, "bad-uplink", nil)
				if err == nil {
					t.Cleanup(func() { _ = e.cni.DelPod(badList, p) })
				}
				require.Equal(t, uint(types.ErrInvalidNetworkConfig), cniCode(t, err), "%v", err)
				require.Contains(t, err.Error(), "uplinks[1]")
				require.Contains(t, err.Error(), tc.dev)
				require.Equal(t, before, e.deviceProgramIDs(tc.dev), "programs put on %s", tc.dev)
				require.Equal(t, 2, e.uplinkProgramIDs(), "the victim's, on the uplink")
				require.Len(t, e.hostLinks(), 1, "the refused pod's veth")
				require.Equal(t, 1, e.records())

				require.NoError(t, e.cni.DelPod(list, victim))
				e.requireClean()
				require.Zero(t, e.uplinkProgramIDs())
			})
		}
	}
}

// testMasqueradeIPDisagrees: masq_nets holds one masquerade address per
// network, which every pod of it leaves with. While a pod of the network
// lives on the node, an ADD of it with another masqueradeIP (or none) is
// refused with code 7 naming the key, the value in force and a pod that
// holds it, and leaves nothing; the pods keep their address. Once none is
// left (another network's pod keeps the node and the entry), a new ADD's
// address replaces the leftover.
func testMasqueradeIPDisagrees(t *testing.T, e *env) {
	for _, a := range []string{"192.0.2.9/24", "192.0.2.10/24"} {
		_, err := nettest.Run(e.node.NS, "ip", "addr", "add", a, "dev", "uplink")
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = nettest.Run(e.node.NS, "ip", "addr", "del", a, "dev", "uplink") })
	}
	srv := newWorldServer(t, e.node.World)
	sourceOf := func(p *nettest.Pod) netip.Addr {
		t.Helper()
		require.NoError(t, udpFrom(p.NS, 0, nettest.WorldIP4, srv.port))
		return srv.last("udp").Addr()
	}
	keep := testutil.AddPod(t, e.cni, e.confList(netOpts{name: "othernet", extra: map[string]any{"ipMasq": true},
		ipam: map[string]any{"type": "ebpf-ipam", "ranges": []any{[]any{map[string]any{"subnet": "10.244.9.0/24"}}}}}), "keep")
	first := e.masqList("1.1.0", "", map[string]any{"masqueradeIP": "192.0.2.9"})
	a := testutil.AddPod(t, e.cni, first, "masq-first")
	require.Equal(t, netip.MustParseAddr("192.0.2.9"), sourceOf(a))

	for _, extra := range []map[string]any{nil, {"masqueradeIP": "192.0.2.10"}} {
		list := e.masqList("1.1.0", "", extra)
		p, err := e.cni.AddPod(list, "masq-second", nil)
		if err == nil {
			t.Cleanup(func() { _ = e.cni.DelPod(list, p) })
		}
		require.Equal(t, uint(types.ErrInvalidNetworkConfig), cniCode(t, err), "%v: %v", extra, err)
		require.Contains(t, err.Error(), "invalid masqueradeIP")
		require.Contains(t, err.Error(), "masqueradeIP 192.0.2.9", "the value in force")
		require.Contains(t, err.Error(), "masq-first/eth0", "a pod that holds it")
		require.Len(t, e.hostLinks(), 2, "the refused pod's veth")
		require.Equal(t, 2, e.records())
		allocs, err := os.ReadDir(filepath.Join(e.stateDir, "ipam", "ebpfnet", "owners"))
		require.NoError(t, err)
		require.Len(t, allocs, 1, "only masq-first's address")
	}
	require.Equal(t, netip.MustParseAddr("192.0.2.9"), sourceOf(a), "the network's pods keep their address")

	require.NoError(t, e.cni.DelPod(first, a))
	plain := e.masqList("1.1.0", "", nil)
	b := testutil.AddPod(t, e.cni, plain, "masq-after")
	require.Equal(t, addr(nettest.NodeIP4), sourceOf(b), "the leftover 192.0.2.9 replaced")
	require.Equal(t, addr(nettest.NodeIP4), sourceOf(keep))
	require.NoError(t, e.cni.DelPod(plain, b))
	require.NoError(t, e.cni.DelPod(e.confList(netOpts{name: "othernet", extra: map[string]any{"ipMasq": true},
		ipam: map[string]any{"type": "ebpf-ipam", "ranges": []any{[]any{map[string]any{"subnet": "10.244.9.0/24"}}}}}), keep))
	e.requireClean()
}

// deviceProgramIDs lists the programs on both directions of the node's
// device name.
func (e *env) deviceProgramIDs(name string) []ebpf.ProgramID {
	e.t.Helper()
	var ids []ebpf.ProgramID
	require.NoError(e.t, e.node.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		for _, h := range uplink.Hooks {
			got, err := attach.AttachedIDs(l, h)
			if err != nil {
				return err
			}
			ids = append(ids, got...)
		}
		return nil
	}))
	return ids
}

// TestMasqueradeExceptions: destinations in nonMasqueradeCIDRs see the
// pod's own address; CHECK notices an uplink without its programs.
func TestMasqueradeExceptions(t *testing.T) {
	e := newEnv(t)
	list := e.masqList("1.1.0", "", map[string]any{"nonMasqueradeCIDRs": []string{"192.0.2.0/24"}})
	p := e.addPod(list, "nomasq")
	_, err := nettest.Run(e.node.World, "ip", "route", "add", "10.244.1.0/24", "via", nettest.NodeIP4.String())
	require.NoError(t, err)
	srv := newWorldServer(t, e.node.World)
	c, err := dialFrom(p.NS, 0, nettest.WorldIP4, srv.port)
	require.NoError(t, err)
	c.Close()
	require.Equal(t, addr(p.IP(4)), srv.last("tcp").Addr(), "a nonMasqueradeCIDRs destination sees the pod")
	// IPv6 is still masqueraded.
	require.NoError(t, udpFrom(p.NS, 0, nettest.WorldIP6, srv.port))
	require.Equal(t, addr(nettest.NodeIP6), srv.last("udp").Addr())

	require.NoError(t, e.cni.Check(list, p.RT))
	require.NoError(t, e.node.NS.Do(func(ns.NetNS) error {
		recs, err := node.AttachmentSets(e.stateDir, "uplinks")
		if err != nil || len(recs) != 1 {
			return fmt.Errorf("uplink records: %v %v", recs, err)
		}
		return attach.DetachNow(recs[0].Attachments[1], recs[0].IfIndex, uplink.Hooks[1])
	}))
	err = e.cni.Check(list, p.RT)
	require.Error(t, err)
	require.Contains(t, err.Error(), "not attached to uplink uplink")
}

// TestMasqueradeReplyEntryBack: a flow whose IN entry the LRU evicted
// alone gets it back from its next packet out (looked at once the second
// changed, not at every packet): its replies reach the pod again.
func TestMasqueradeReplyEntryBack(t *testing.T) {
	e := newEnv(t)
	a := e.addPod(e.masqList("1.1.0", "", nil), "back-a")
	srv := newWorldServer(t, e.node.World)
	const lport = 5401
	require.NoError(t, udpFrom(a.NS, lport, nettest.WorldIP4, srv.port))
	require.Equal(t, addr(nettest.NodeIP4), srv.last("udp").Addr())

	n := e.handle()
	defer n.Close()
	nat, err := n.Map(maps.CniMapNat)
	require.NoError(t, err)
	ins := func() (keys []maps.CniNatKey) {
		es, err := maps.Entries[maps.CniNatKey, maps.CniNatEntry](nat)
		require.NoError(t, err)
		for _, en := range es {
			if en.Key.Dir == uint8(maps.CniNatDirNAT_DIR_IN) && en.Key.Proto == unix.IPPROTO_UDP &&
				net.IP(en.Value.Addr[:4]).Equal(a.IP(4)) && en.Value.Port == htons(lport) {
				keys = append(keys, en.Key)
			}
		}
		return keys
	}
	evict := ins()
	require.Len(t, evict, 1, "the flow's IN entry")
	require.NoError(t, nat.Delete(&evict[0]))
	time.Sleep(1100 * time.Millisecond) // into another second (2^30 ns) of the flow's
	require.NoError(t, udpFrom(a.NS, lport, nettest.WorldIP4, srv.port), "the flow's replies after its IN entry was evicted")
	require.Equal(t, netip.AddrPortFrom(addr(nettest.NodeIP4), lport), srv.last("udp"), "the flow kept its translation")
	require.Len(t, ins(), 1, "the IN entry is not back")
}
