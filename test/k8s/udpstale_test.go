package k8s_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
)

// udpClient is a UDP socket in a pod, bound to one port and kept open, as
// a DNS forwarder or a statsd agent keeps it: every datagram it sends to a
// Service belongs to the same flow.
type udpClient struct {
	c   *net.UDPConn
	dst *net.UDPAddr
}

func newUDPClient(t *testing.T, pod ns.NetNS, dst net.IP, port int) *udpClient {
	t.Helper()
	u := &udpClient{dst: &net.UDPAddr{IP: dst, Port: port}}
	require.NoError(t, pod.Do(func(ns.NetNS) error {
		var err error
		u.c, err = net.ListenUDP("udp", nil) // unconnected: an ICMP error does not close it
		return err
	}))
	t.Cleanup(func() { u.c.Close() })
	return u
}

// ask sends one datagram and waits up to wait for an answer; a late answer
// to an earlier datagram counts too.
func (u *udpClient) ask(wait time.Duration) (bool, error) {
	if _, err := u.c.WriteToUDP([]byte("who?"), u.dst); err != nil {
		return false, err
	}
	buf := make([]byte, 512)
	_ = u.c.SetReadDeadline(time.Now().Add(wait))
	for {
		n, _, err := u.c.ReadFromUDP(buf)
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			return false, nil
		case errors.Is(err, syscall.ECONNREFUSED):
			continue
		case err != nil:
			return false, err
		}
		var name, seen string
		if _, err := fmt.Sscanf(string(buf[:n]), "%s %s", &name, &seen); err == nil && name == "b" {
			return true, nil
		}
	}
}

// syncProxy replaces node n's kube-proxy rules of family fam with k's, as
// kube-proxy's next sync does.
func syncProxy(t *testing.T, n *node, fam int, mode nettest.ProxyMode, k *nettest.KubeProxy) {
	t.Helper()
	if mode == nettest.ModeIPTables {
		tool := "iptables"
		if fam == 6 {
			tool = "ip6tables"
		}
		for _, c := range [][]string{{"-t", "filter", "-F", "INPUT"}, {"-t", "filter", "-F", "FORWARD"}, {"-t", "filter", "-F", "OUTPUT"},
			{"-t", "nat", "-F", "PREROUTING"}, {"-t", "nat", "-F", "OUTPUT"}, {"-t", "nat", "-F", "POSTROUTING"}} {
			out, err := nettest.Run(n.NS, tool, c...)
			require.NoError(t, err, out)
		}
	}
	require.NoError(t, k.Install(n.NS, mode))
}

// clearUDP deletes the UDP conntrack entries toward ip, what kube-proxy
// does for a Service whose endpoints changed (its remedy for stale UDP
// flows).
func clearUDP(t *testing.T, n *node, ip net.IP) {
	t.Helper()
	f := &netlink.ConntrackFilter{}
	require.NoError(t, f.AddIP(netlink.ConntrackOrigDstIP, ip))
	require.NoError(t, f.AddProtocol(17))
	fam := netlink.InetFamily(netlink.FAMILY_V4)
	if ip.To4() == nil {
		fam = netlink.FAMILY_V6
	}
	require.NoError(t, n.NS.Do(func(ns.NetNS) error {
		_, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, fam, f)
		return err
	}))
}

// TestUDPClientBeforeEndpoint: a UDP client that started before its
// Service could answer recovers once it can, in both kube-proxy modes,
// IPv4 and IPv6, as with a bridge. Two ways it started too early:
//   - the Service had no endpoint: kube-proxy rejects its datagrams, which
//     conntrack never confirms, so the flow stays pending (on the stack
//     path) however many are rejected;
//   - kube-proxy had not synced the Service yet: in nftables mode its
//     datagrams are dropped (an unallocated ClusterIP), as above; in
//     iptables mode they leave untranslated toward the ClusterIP,
//     conntrack confirms the flow without NAT and it settles fast. When kube-proxy syncs it and deletes
//     the ClusterIP's UDP conntrack entries, the flow goes back to the
//     stack and meets the new DNAT.
//
// Either way the next datagram after kube-proxy's sync and cleanup is
// answered (at most three are allowed, for an answer that comes late), by
// the endpoint, through the stack.
func TestUDPClientBeforeEndpoint(t *testing.T) {
	for _, mode := range []nettest.ProxyMode{nettest.ModeIPTables, nettest.ModeNFTables} {
		t.Run(string(mode), func(t *testing.T) {
			c := newCluster(t, 1, false)
			n := c.nodes[0]
			l := n.list("1.1.0", nil)
			a, b := n.addPod(l, "a"), n.addPod(l, "b")
			serve(t, b.NS, "b", backendPort)
			for _, fam := range []int{4, 6} {
				for _, start := range []string{"no endpoint", "not synced"} {
					t.Run(fmt.Sprintf("IPv%d/%s", fam, start), func(t *testing.T) {
						udpBeforeEndpoint(t, n, a, b, fam, mode, start)
					})
				}
			}
		})
	}
}

func udpBeforeEndpoint(t *testing.T, n *node, a, b *nettest.Pod, fam int, mode nettest.ProxyMode, start string) {
	svcIP := pick(fam, net.ParseIP("10.96.0.53"), net.ParseIP("fd00:96::53"))
	if start == "not synced" {
		svcIP = pick(fam, net.ParseIP("10.96.0.54"), net.ParseIP("fd00:96::54"))
	}
	proxy := func(eps ...nettest.Endpoint) *nettest.KubeProxy {
		k := kubeProxy(n, fam, b, b, b) // the node's other Services: conntrack is active
		if start == "no endpoint" || len(eps) > 0 {
			k.Services = append(k.Services, &nettest.Service{Namespace: "default", Name: "dns", PortName: "dns", Protocol: "udp",
				ClusterIP: svcIP, Port: 53, Endpoints: eps})
		}
		return k
	}
	syncProxy(t, n, fam, mode, proxy())

	u := newUDPClient(t, a.NS, svcIP, 53)
	for i := 0; i < 5; i++ {
		ok, err := u.ask(200 * time.Millisecond)
		require.NoError(t, err)
		require.False(t, ok, "datagram %d answered before the Service had an endpoint", i)
	}
	// Rejected, or (nftables) dropped as an unallocated ClusterIP: never
	// confirmed. Unknown to iptables: out untranslated, confirmed.
	want := "pending"
	if start == "not synced" && mode == nettest.ModeIPTables {
		want = "fast"
	}
	require.Equal(t, want, flowTo(n, a.IP(fam), svcIP), "the client's flow before the endpoint")

	// The endpoint appears: kube-proxy syncs, then deletes the
	// ClusterIP's UDP conntrack entries.
	syncProxy(t, n, fam, mode, proxy(nettest.Endpoint{IP: b.IP(fam), Port: backendPort}))
	clearUDP(t, n, svcIP)
	answered := -1
	for i := 0; i < 3 && answered < 0; i++ {
		ok, err := u.ask(2 * time.Second)
		require.NoError(t, err)
		if ok {
			answered = i
		}
	}
	require.GreaterOrEqual(t, answered, 0, "the client is not answered after the endpoint appeared (flow %s)", flowTo(n, a.IP(fam), svcIP))
	require.Equal(t, "stack", flowTo(n, a.IP(fam), svcIP), "the flow netfilter translates goes through the stack")
}

// flowTo is the verdict of the pod's UDP flow to remote ("" when none).
func flowTo(n *node, pod, remote net.IP) string {
	for _, f := range n.flows() {
		if f.Proto == "udp" && f.Pod == pod.String() && f.Remote == remote.String() {
			return f.Verdict
		}
	}
	return ""
}
