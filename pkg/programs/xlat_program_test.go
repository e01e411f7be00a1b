package programs_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/nodetest"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/flows"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// TestBypassPrograms runs from_container on crafted packets for the flows
// set up in BPF (bpf/lib/xlat.h): while the node agent's lease runs, a new
// flow to a destination outside the set of those netfilter may translate
// is fast from its first packet; a destination in the set, or any once the
// lease is over, meets netfilter first as before.
func TestBypassPrograms(t *testing.T) {
	e := newFlowEnv(t)
	a := e.hA.Attrs().Index
	from := endpoint.HookFromContainer.Name
	set, err := flows.OpenTranslated(nodetest.Handle(t, e.bpfRoot, t.TempDir()))
	require.NoError(t, err)
	svc := netip.MustParsePrefix("10.96.0.0/16")
	want := flows.Set{}
	want.Add(svc, maps.CniXlatKindXLAT_SERVICE_RANGE)
	require.NoError(t, set.Write(want))

	t.Run("no lease: every new flow meets netfilter", func(t *testing.T) {
		ret, _ := e.runProg(t, from, a, tcp4(macA, ipA4, world4, 42000, 80, tcpSYN))
		require.Equal(t, uint32(tcActPass), ret, "written but never leased: the SYN goes to the stack")
		f, _ := e.flow(t, ipA4, 42000, world4, 80, 6)
		require.Equal(t, maps.CniFlowVerdictFLOW_PENDING, f.Verdict)
	})

	require.NoError(t, set.Renew(time.Minute))
	l, err := set.Lease()
	require.NoError(t, err)
	require.True(t, l.Valid())
	require.Equal(t, uint32(1), l.Entries)

	t.Run("a destination outside the set: fast from the first packet", func(t *testing.T) {
		before := e.count(t, maps.CniPktReasonREASON_FLOW_NEW)
		ret, out := e.runProg(t, from, a, tcp4(macA, ipA4, world4, 42001, 80, tcpSYN))
		require.Equal(t, uint32(tcActRedirect), ret, "the SYN takes the fast path")
		require.Equal(t, []byte(macWorld), out[0:6])
		f, ok := e.flow(t, ipA4, 42001, world4, 80, 6)
		require.True(t, ok)
		require.Equal(t, maps.CniFlowVerdictFLOW_FAST, f.Verdict)
		require.Equal(t, maps.CniFlowFlagsFLOW_F_BYPASS, f.Flags)
		ret, _ = e.runProg(t, from, a, tcp4(macA, ipA4, world4, 42001, 80, tcpACK))
		require.Equal(t, uint32(tcActRedirect), ret)
		require.Equal(t, before, e.count(t, maps.CniPktReasonREASON_FLOW_NEW), "nothing handed to netfilter")
	})

	t.Run("a destination in the set meets netfilter", func(t *testing.T) {
		ret, _ := e.runProg(t, from, a, tcp4(macA, ipA4, netip.MustParseAddr("10.96.3.4").AsSlice(), 42002, 80, tcpSYN))
		require.Equal(t, uint32(tcActPass), ret)
		f, _ := e.flow(t, ipA4, 42002, netip.MustParseAddr("10.96.3.4").AsSlice(), 80, 6)
		require.Equal(t, maps.CniFlowVerdictFLOW_PENDING, f.Verdict)
	})

	t.Run("a UDP flow whose destination joins the set meets netfilter", func(t *testing.T) {
		ret, _ := e.runProg(t, from, a, udp4(macA, ipA4, world4, 5400, 53))
		require.Equal(t, uint32(tcActRedirect), ret)
		f, _ := e.flow(t, ipA4, 5400, world4, 53, 17)
		require.Equal(t, maps.CniFlowFlagsFLOW_F_BYPASS, f.Flags)
		ret, _ = e.runProg(t, from, a, udp4(macA, ipA4, world4, 5400, 53))
		require.Equal(t, uint32(tcActRedirect), ret, "conntrack is not asked: it has no entry of a flow set up in BPF")
		// The world address becomes an externalIP.
		grown := flows.Set{}
		grown.Add(svc, maps.CniXlatKindXLAT_SERVICE_RANGE)
		grown.AddAddr(netip.AddrFrom4([4]byte(world4)), maps.CniXlatKindXLAT_EXTERNAL_IP)
		require.NoError(t, set.Write(grown))
		ret, _ = e.runProg(t, from, a, udp4(macA, ipA4, world4, 5400, 53))
		require.Equal(t, uint32(tcActPass), ret, "to the stack, where kube-proxy's rules decide")
		f, _ = e.flow(t, ipA4, 5400, world4, 53, 17)
		require.Equal(t, maps.CniFlowVerdictFLOW_PENDING, f.Verdict)
		require.Zero(t, f.Flags&maps.CniFlowFlagsFLOW_F_BYPASS)
		require.NoError(t, set.Write(want))
	})

	t.Run("an expired lease: every new flow meets netfilter", func(t *testing.T) {
		require.NoError(t, set.Expire())
		ret, _ := e.runProg(t, from, a, tcp4(macA, ipA4, world4, 42003, 80, tcpSYN))
		require.Equal(t, uint32(tcActPass), ret)
		f, _ := e.flow(t, ipA4, 42003, world4, 80, 6)
		require.Equal(t, maps.CniFlowVerdictFLOW_PENDING, f.Verdict)
		// A UDP flow set up in BPF meets it at its next packet.
		ret, _ = e.runProg(t, from, a, udp4(macA, ipA4, world4, 5401, 53))
		require.Equal(t, uint32(tcActPass), ret)
		require.NoError(t, set.Renew(time.Minute))
		ret, _ = e.runProg(t, from, a, udp4(macA, ipA4, world4, 5402, 53))
		require.Equal(t, uint32(tcActRedirect), ret)
		require.NoError(t, set.Renew(-time.Second))
		ret, _ = e.runProg(t, from, a, udp4(macA, ipA4, world4, 5402, 53))
		require.Equal(t, uint32(tcActPass), ret, "the lease ran out: to the stack")
	})
}
