package datapath_test

import (
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

// BenchmarkDeviceTypes: same-node pod to pod, netkit pods against veth
// pods on one node (two pods of each), in rounds that measure both kinds
// back to back, in an order that alternates from round to round: RR (one
// byte each way over one TCP connection, transactions per second), CRR
// (connect, one byte each way, close: connections per second) and TCP
// (iperf3, one stream, Gbit/s). It reports each kind's median and, per
// metric, the median of the rounds' netkit/veth ratios with their range.
// Under emulation (make test-kernel) only these ratios mean something,
// and only as an indication:
//
//	make test-kernel KERNEL=linux-image-6.12.113+deb12-amd64-unsigned \
//	    VM_TESTS=test/datapath VM_RUN='^$' VM_BENCH=DeviceTypes
//
// It needs a kernel with netkit; -benchtime is ignored (EBPF_CNI_BENCH_ROUNDS
// rounds, 5 by default, of EBPF_CNI_BENCH_SECONDS, 2 by default, a figure).
func BenchmarkDeviceTypes(b *testing.B) {
	testutil.RequireNetkit(b)
	rounds, secs := envInt("EBPF_CNI_BENCH_ROUNDS", 5), envInt("EBPF_CNI_BENCH_SECONDS", 2)
	e := newBenchEnv(b)
	kinds := []string{"veth", "netkit"}
	pods := map[string][2]*nettest.Pod{}
	for _, k := range kinds {
		list := e.confList(netOpts{extra: map[string]any{"deviceType": k}})
		pods[k] = [2]*nettest.Pod{e.addPod(list, k+"-client"), e.addPod(list, k+"-server")}
	}
	type figures struct{ rr, crr, tcp float64 }
	got := map[string][]figures{}
	measure := func(k string) figures {
		c, s := pods[k][0], pods[k][1]
		l, err := nettest.Listen(s.NS, s.IP(4))
		require.NoError(b, err)
		defer l.Close()
		var f figures
		f.rr = rr(b, c, l.Addr().String(), time.Duration(secs)*time.Second)
		f.crr = crr(b, c, l.Addr().String(), time.Duration(secs)*time.Second)
		res, err := nettest.Iperf(c.NS, s.NS, s.IP(4), 5301, secs)
		require.NoError(b, err)
		f.tcp = res.BitsPerSecond / 1e9
		return f
	}
	b.ResetTimer()
	for r := range rounds {
		order := slices.Clone(kinds)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, k := range order {
			got[k] = append(got[k], measure(k))
		}
	}
	b.StopTimer()
	pick := map[string]func(figures) float64{
		"rr_tps":   func(f figures) float64 { return f.rr },
		"crr_cps":  func(f figures) float64 { return f.crr },
		"tcp_gbps": func(f figures) float64 { return f.tcp },
	}
	for _, name := range []string{"rr_tps", "crr_cps", "tcp_gbps"} {
		var ratios []float64
		for _, k := range kinds {
			var v []float64
			for _, f := range got[k] {
				v = append(v, pick[name](f))
			}
			b.ReportMetric(median(v), name+"_"+k)
		}
		for i := range rounds {
			ratios = append(ratios, pick[name](got["netkit"][i])/pick[name](got["veth"][i]))
		}
		b.ReportMetric(median(ratios), name+"_netkit/veth")
		b.Logf("%s netkit/veth: median %.3f, rounds %.3f..%.3f (%d rounds)", name, median(ratios), slices.Min(ratios), slices.Max(ratios), rounds)
	}
}

// rr is the transactions per second of one-byte request/response over
// one TCP connection from c to addr, for d.
func rr(b *testing.B, c *nettest.Pod, addr string, d time.Duration) float64 {
	conn, err := nettest.Dial(c.NS, addr)
	require.NoError(b, err)
	defer conn.Close()
	buf := []byte{1}
	n := 0
	t0 := time.Now()
	for time.Since(t0) < d {
		if _, err := conn.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := conn.Read(buf); err != nil {
			b.Fatal(err)
		}
		n++
	}
	return float64(n) / time.Since(t0).Seconds()
}

// crr is the connections per second from c to addr (connect, one byte
// each way, close), for d.
func crr(b *testing.B, c *nettest.Pod, addr string, d time.Duration) float64 {
	n := 0
	t0 := time.Now()
	for time.Since(t0) < d {
		conn, err := nettest.Dial(c.NS, addr)
		require.NoError(b, err)
		require.NoError(b, nettest.Echo(conn, "x"))
		conn.Close()
		n++
	}
	return float64(n) / time.Since(t0).Seconds()
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// envInt is the integer environment variable name, or def.
func envInt(name string, def int) int {
	var n int
	if _, err := fmt.Sscan(os.Getenv(name), &n); err != nil || n <= 0 {
		return def
	}
	return n
}
