package programs_test

import (
	"net"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
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
			opts := &ebpf.RunOptions{Data: c.pkt, Context: skbCtx{Ifindex: uint32(a.Index)}}
			before, err := e.prog.Stats()
			require.NoError(b, err)
			b.ResetTimer()
			require.NoError(b, e.n.Do(func(ns.NetNS) error {
				for range b.N {
					ret, err := e.prog.Run(opts)
					if err != nil {
						return err
					}
					if ret != c.ret {
						b.Fatalf("from_container returned %d, want %d", ret, c.ret)
					}
				}
				return nil
			}))
			b.StopTimer()
			after, err := e.prog.Stats()
			require.NoError(b, err)
			runs := after.RunCount - before.RunCount
			require.EqualValues(b, b.N, runs, "runs counted by the kernel")
			b.ReportMetric(float64((after.Runtime-before.Runtime).Nanoseconds())/float64(runs), "ns/packet")
		})
	}
}
