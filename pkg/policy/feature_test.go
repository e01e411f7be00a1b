package policy

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

func openNode(t *testing.T) *node.Node {
	t.Helper()
	n, err := node.Open(node.Options{BPFRoot: testutil.BPFFS(t), StateDir: t.TempDir(), Lock: node.Unlocked})
	require.NoError(t, err)
	t.Cleanup(func() { n.Close() })
	return n
}

func endpointOf(ifindex int, hostMAC, ns string) *feature.Endpoint {
	r := &node.Record{ContainerID: "c", HostIfIndex: ifindex, HostMAC: hostMAC, MAC: "0e:00:00:00:00:01"}
	if ns != "" {
		r.Pod = &node.Pod{Namespace: ns, Name: "p"}
	}
	return &feature.Endpoint{Record: r, Recorded: true}
}

// TestAddFirstState: ADD closes the directions the pod's namespace
// isolates and turns the lookups on; a pod of another namespace (or none)
// starts open, with a stale state of its ifindex deleted; a failed ADD's
// undo takes the state away.
func TestAddFirstState(t *testing.T) {
	n := openNode(t)
	m, err := MapsOf(n)
	require.NoError(t, err)
	require.NoError(t, m.SetNamespace("shop", NamespaceFact{Ingress: true}))
	p, err := Feature{}.Parse(nil)
	require.NoError(t, err)

	undo := &feature.Undo{}
	require.NoError(t, p.Add(n, endpointOf(10, "", "shop"), undo))
	st, ok, err := m.Endpoint(10)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, EndpointState{Ingress: uint8(StateClosed), Egress: uint8(StateOpen)}, st)
	on, err := m.Active()
	require.NoError(t, err)
	require.True(t, on)
	require.NoError(t, undo.Run())
	_, ok, err = m.Endpoint(10)
	require.NoError(t, err)
	require.False(t, ok, "undo left the state")

	require.NoError(t, m.SetEndpoint(11, EndpointState{Egress: uint8(StateEnforce)}))
	for _, ns := range []string{"other", ""} {
		require.NoError(t, p.Add(n, endpointOf(11, "", ns), &feature.Undo{}))
		_, ok, err = m.Endpoint(11)
		require.NoError(t, err)
		require.False(t, ok, "namespace %q: a stale state of the ifindex stays", ns)
	}
}

// TestDelKeepsNewPodsState: DEL removes the endpoint's state and drops,
// unless endpoint_devs says its ifindex is another pod's by now.
func TestDelKeepsNewPodsState(t *testing.T) {
	n := openNode(t)
	m, err := MapsOf(n)
	require.NoError(t, err)
	devs, err := n.Map(maps.CniMapEndpointDevs)
	require.NoError(t, err)
	closed := EndpointState{Ingress: uint8(StateClosed)}
	require.NoError(t, m.SetEndpoint(20, closed))
	require.NoError(t, m.DropMap.Put(&maps.CniPolicyDropKey{Ifindex: 20, Dir: uint32(Ingress)}, make([]uint64, mustCPUs(t))))
	d := maps.CniEndpointDev{HostMac: [6]byte{0x0e, 0, 0, 0, 0, 0x99}}
	require.NoError(t, devs.Put(uint32(20), &d))

	ep := endpointOf(20, "0e:00:00:00:00:02", "shop")
	require.NoError(t, Feature{}.Del(n, ep))
	_, ok, err := m.Endpoint(20)
	require.NoError(t, err)
	require.True(t, ok, "a new pod's state of the ifindex went")

	require.NoError(t, devs.Delete(uint32(20)))
	require.NoError(t, Feature{}.Del(n, ep))
	_, ok, err = m.Endpoint(20)
	require.NoError(t, err)
	require.False(t, ok)
	got, err := m.DropEndpoints()
	require.NoError(t, err)
	require.Empty(t, got)
	require.NoError(t, Feature{}.Del(n, ep), "twice")
}

// TestGCSweepsGoneEndpoints: states, drop counters and rules of endpoints
// that are gone are listed by a dry run and removed by a real run; a live
// endpoint's stay.
func TestGCSweepsGoneEndpoints(t *testing.T) {
	n := openNode(t)
	all, err := Open(n)
	require.NoError(t, err)
	defer all.Close()
	for _, i := range []uint32{30, 31} {
		require.NoError(t, all.SetEndpoint(i, EndpointState{Egress: uint8(StateEnforce)}))
		require.NoError(t, all.PutRules(i, Egress, []Entry{{Prefix: netip.MustParsePrefix("10.0.0.0/8")}}))
	}
	require.NoError(t, all.DropMap.Put(&maps.CniPolicyDropKey{Ifindex: 32, Dir: uint32(Egress)}, make([]uint64, mustCPUs(t))))
	live := feature.NewLive(map[string]*node.Record{"live": {HostIfName: "live", HostIfIndex: 30}})
	want := []string{"policy_endpoints[31]", "policy_rules[31 egress] (1 entries)", "policy_drops[32]"}
	dry, err := Feature{}.GC(n, live, true)
	require.NoError(t, err)
	require.ElementsMatch(t, want, dry)
	done, err := Feature{}.GC(n, live, false)
	require.NoError(t, err)
	require.ElementsMatch(t, want, done)
	again, err := Feature{}.GC(n, live, true)
	require.NoError(t, err)
	require.Empty(t, again)
	_, ok, err := all.Endpoint(30)
	require.NoError(t, err)
	require.True(t, ok, "the live endpoint's state went")
}

func mustCPUs(t *testing.T) int {
	t.Helper()
	n, err := ebpf.PossibleCPU()
	require.NoError(t, err)
	return n
}
