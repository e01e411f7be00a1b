package k8s_test

import (
	"net"
	"strconv"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/conflisttest"
	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/nodetest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/cluster"
	"github.com/ebpf-cni/ebpf-cni/pkg/counters"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// cl is a simulated cluster whose nodes run ebpf-cni, each with its own
// bpffs and state directory.
type cl struct {
	t     *testing.T
	c     *nettest.Cluster
	nodes []*node
}

type node struct {
	*nettest.ClusterNode
	t                 *testing.T
	cni               *nettest.CNI
	bpfRoot, stateDir string
}

func newCluster(t *testing.T, lan int, far bool) *cl {
	t.Helper()
	testutil.RequireRoot(t)
	c, err := nettest.NewCluster(lan, far)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	paths := []string{testutil.PluginDir(t), testutil.RefPluginDir(t)}
	out := &cl{t: t, c: c}
	for _, cn := range c.Nodes {
		n := &node{ClusterNode: cn, t: t, bpfRoot: testutil.BPFFS(t), stateDir: t.TempDir()}
		n.cni = nettest.NewCNI(cn.Node, paths, t.TempDir())
		out.nodes = append(out.nodes, n)
	}
	return out
}

// list is the node's ebpf-cni configuration list: its pod ranges, the
// cluster's, masquerade on, extra keys, and chained plugins.
func (n *node) list(version string, extra map[string]any, chained ...map[string]any) *libcni.NetworkConfigList {
	keys := map[string]any{"ipMasq": true, "clusterCIDRs": []string{nettest.ClusterCIDR4.String(), nettest.ClusterCIDR6.String()}}
	for k, v := range extra {
		keys[k] = v
	}
	return conflisttest.List(n.t, conflisttest.Options{Name: "k8s", Version: version, BPFRoot: n.bpfRoot, StateDir: n.stateDir,
		IPAM: n.IPAM(), Keys: keys, Chained: chained})
}

func (n *node) addPod(list *libcni.NetworkConfigList, id string) *nettest.Pod {
	n.t.Helper()
	return testutil.AddPod(n.t, n.cni, list, id)
}

// tunnels points this node's overlay at the other nodes' pod ranges, by
// their addresses of family fam, as the node agent does (cluster.Tunnels).
func (n *node) tunnels(fam int, others ...*node) {
	n.t.Helper()
	require.NoError(n.t, n.NS.Do(func(ns.NetNS) error {
		ts, err := cluster.OpenTunnels(nodetest.Handle(n.t, n.bpfRoot, n.stateDir))
		if err != nil {
			return err
		}
		defer ts.Close()
		var want []cluster.Tunnel
		for _, o := range others {
			want = append(want, cluster.Tunnel{PodCIDR: o.PodCIDR4, Node: o.Addr(fam)}, cluster.Tunnel{PodCIDR: o.PodCIDR6, Node: o.Addr(fam)})
		}
		return ts.Sync(want)
	}))
}

func (n *node) counters() map[maps.CniPktReason]counters.Counter {
	n.t.Helper()
	c, err := counters.ReadCounters(n.bpfRoot)
	require.NoError(n.t, err)
	return c
}

func (n *node) delta(before map[maps.CniPktReason]counters.Counter, r maps.CniPktReason) uint64 {
	return n.counters()[r].Packets - before[r].Packets
}

// deviceCount is what the programs of the node's device dev counted for
// reason r, both directions.
func (n *node) deviceCount(dev string, r maps.CniPktReason) uint64 {
	n.t.Helper()
	var ifindex int
	require.NoError(n.t, n.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(dev)
		if err == nil {
			ifindex = l.Attrs().Index
		}
		return err
	}))
	d, done, err := counters.PinnedDevices(n.bpfRoot, true)
	require.NoError(n.t, err)
	defer done()
	devs, err := d.Totals()
	require.NoError(n.t, err)
	return devs[uint32(ifindex)][r].Packets
}

// mtu is the MTU of the pod's eth0.
func mtu(t *testing.T, p *nettest.Pod) int {
	t.Helper()
	var m int
	require.NoError(t, p.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err == nil {
			m = l.Attrs().MTU
		}
		return err
	}))
	return m
}

func hp(ip net.IP, port int) string { return net.JoinHostPort(ip.String(), strconv.Itoa(port)) }

func serve(t *testing.T, n ns.NetNS, name string, port int) *nettest.WhoServer {
	t.Helper()
	s, err := nettest.ServeWho(n, name, port)
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s
}

// mustSee asks over TCP and UDP who answers at ip:port from n, and that it
// saw want as the client's address.
func mustSee(t *testing.T, from ns.NetNS, ip net.IP, port int, server string, want net.IP, what string) {
	t.Helper()
	w, err := nettest.AskWho(from, hp(ip, port), 0)
	require.NoError(t, err, "%s: TCP to %s", what, hp(ip, port))
	require.Equal(t, server, w.Name, "%s: TCP answered by", what)
	require.True(t, want.Equal(w.SeenIP()), "%s: TCP client seen as %s, want %s", what, w.Seen, want)
	w, err = nettest.AskWhoUDP(from, hp(ip, port))
	require.NoError(t, err, "%s: UDP to %s", what, hp(ip, port))
	require.Equal(t, server, w.Name, "%s: UDP answered by", what)
	require.True(t, want.Equal(w.SeenIP()), "%s: UDP client seen as %s, want %s", what, w.Seen, want)
}
