package programs_test

import (
	"net"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/uplink"
)

// BenchmarkFromContainer runs from_container (BPF_PROG_TEST_RUN) on the
// packets of its common paths and reports ns/packet: the program's own run
// time from the kernel's BPF statistics, without the hook, the redirect or
// the stack around it, and without the syscall that ns/op includes (one run
// per call: the program rewrites the packet, so the kernel's repeat would
// run it on its own output). docs/performance.md, "Pod to pod". As root:
// go test -run XXX -bench FromContainer ./pkg/programs/
func BenchmarkFromContainer(b *testing.B) {
	e := newProgramEnv(b)
	a := e.hA.Attrs()
	stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	require.NoError(b, err)
	b.Cleanup(func() { stats.Close() })
	for _, c := range []struct {
		name string
		pkt  []byte
		ret  uint32
	}{
		{"pod to pod v4", icmp4(macA, ipA4, ipB4, 64), tcActRedirect},
		{"pod to pod v6", udp6(macA, ipA6, ipB6, 64), tcActRedirect},
		{"to the world via fib", icmp4(macA, ipA4, world4, 64), tcActRedirect},
		{"to the node", icmp4(macA, ipA4, uplink4, 64), tcActPass},
		{"spoofed v4 source", icmp4(macA, net.ParseIP("10.9.9.9"), ipB4, 64), tcActShot},
	} {
		b.Run(c.name, func(b *testing.B) {
			perPacket(b, e, e.prog, "from_container", c.pkt, skbCtx{Ifindex: uint32(a.Index)}, c.ret)
		})
	}
}

// BenchmarkUplink runs the uplink's programs on a masqueraded TCP flow's
// packets, as BenchmarkFromContainer does from_container: to_netdev on the
// pod's packets of the established flow (the SYN that made its entries ran
// before), from_netdev on the replies; and to_netdev on a packet to a
// destination in the network's one nonMasqueradeCIDRs entry (its pod
// range, the default), as another node's pod by direct routing. ns/packet is the
// program's own run time. docs/performance.md, "Masquerade". As root:
// go test -run XXX -bench Uplink ./pkg/programs/
func BenchmarkUplink(b *testing.B) {
	e := newProgramEnv(b)
	up := e.uplink(b)
	e.masquerade(b, up, 61000, 65535)
	skip := maps.CniMasqSkipKey{Prefixlen: 40 + 16, Family: 4}
	copy(skip.Addr[:], ipA4)
	require.NoError(b, e.pinned(b, maps.CniMapMasqSkip)[maps.CniMapMasqSkip].Put(&skip, uint32(1)))
	stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	require.NoError(b, err)
	b.Cleanup(func() { stats.Close() })
	toNetdev := mustProg(b, e.progs, uplink.HookToNetdev.Name)
	fromNetdev := mustProg(b, e.progs, uplink.HookFromNetdev.Name)
	ctx := skbCtx{Ifindex: uint32(up.Attrs().Index)}
	require.NoError(b, e.n.Do(func(ns.NetNS) error {
		ret, err := toNetdev.Run(&ebpf.RunOptions{Data: tcp4(macA, ipA4, world4, 40000, 80, 0x02), Context: ctx})
		if err == nil && ret != tcActPass {
			b.Fatalf("to_netdev returned %d on the SYN", ret)
		}
		return err
	}))
	for _, c := range []struct {
		name string
		prog *ebpf.Program
		pkt  []byte
		ret  uint32
	}{
		{"to_netdev, the pod's packet", toNetdev, tcp4(macA, ipA4, world4, 40000, 80, 0x10), tcActPass},
		{"from_netdev, the reply", fromNetdev, tcp4(macWorld, world4, uplink4, 80, 40000, 0x10), tcActRedirect},
		// Another node's pod, by direct routing: not translated.
		{"to_netdev, to an exception", toNetdev, tcp4(macA, ipA4, net.ParseIP("10.0.9.9").To4(), 40000, 80, 0x10), tcActPass},
	} {
		b.Run(c.name, func(b *testing.B) { perPacket(b, e, c.prog, c.name, c.pkt, ctx, c.ret) })
	}
}

// perPacket runs prog on pkt b.N times (one run per call, in the env's
// namespace), fails on another verdict than want, and reports the
// program's own run time per packet from the kernel's BPF statistics.
func perPacket(b *testing.B, e *programEnv, prog *ebpf.Program, name string, pkt []byte, ctx skbCtx, want uint32) {
	opts := &ebpf.RunOptions{Data: pkt, Context: ctx}
	before, err := prog.Stats()
	require.NoError(b, err)
	b.ResetTimer()
	require.NoError(b, e.n.Do(func(ns.NetNS) error {
		for range b.N {
			ret, err := prog.Run(opts)
			if err != nil {
				return err
			}
			if ret != want {
				b.Fatalf("%s returned %d, want %d", name, ret, want)
			}
		}
		return nil
	}))
	b.StopTimer()
	after, err := prog.Stats()
	require.NoError(b, err)
	runs := after.RunCount - before.RunCount
	require.EqualValues(b, b.N, runs, "runs counted by the kernel")
	b.ReportMetric(float64((after.Runtime-before.Runtime).Nanoseconds())/float64(runs), "ns/packet")
}
