package datapath_test

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
)

// Run: go test -run XXX -bench . -benchtime 100x ./test/datapath/
// Figures are reported as custom metrics (p50/p99 in ms, RTT in µs).

func bridgeList(b *testing.B, e *env) *libcni.NetworkConfigList {
	conf := map[string]any{"cniVersion": "1.0.0", "name": "brnet", "plugins": []any{map[string]any{
		"type": "bridge", "bridge": "cni0", "isGateway": true,
		"ipam": map[string]any{"type": "host-local", "dataDir": b.TempDir(), "ranges": []any{
			[]any{map[string]any{"subnet": "10.245.0.0/16"}}}},
	}}}
	raw, err := json.Marshal(conf)
	require.NoError(b, err)
	l, err := libcni.ConfListFromBytes(raw)
	require.NoError(b, err)
	return l
}

func percentile(d []time.Duration, p float64) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p)
	return float64(s[i]) / float64(time.Millisecond)
}

// BenchmarkAddDel: sequential ADD then DEL latency through libcni, ebpf-cni
// (tcx, tc; ebpf-ipam) against Debian's bridge + host-local.
func BenchmarkAddDel(b *testing.B) {
	for _, kind := range []string{"tcx", "tc", "bridge"} {
		b.Run(kind, func(b *testing.B) {
			e := newBenchEnv(b)
			list := e.confList(netOpts{attachMode: kind, ipam: map[string]any{"type": "ebpf-ipam", "ranges": []any{
				[]any{map[string]any{"subnet": "10.244.0.0/16"}}}}})
			if kind == "bridge" {
				list = bridgeList(b, e)
			}
			// Warm up: the first ADD loads the programs (once per node).
			w, err := e.cni.AddPod(list, "warm", nil)
			require.NoError(b, err)
			defer e.cni.DelPod(list, w)
			var adds, dels []time.Duration
			pods := make([]*nettest.Pod, 0, b.N)
			nss := make([]*nettest.Pod, b.N)
			for i := range b.N {
				n, err := nettest.NewNetNS()
				require.NoError(b, err)
				nss[i] = &nettest.Pod{NS: n, RT: &libcni.RuntimeConf{ContainerID: fmt.Sprintf("b-%d", i), NetNS: n.Path(), IfName: "eth0"}}
			}
			b.ResetTimer()
			for _, p := range nss {
				t0 := time.Now()
				_, err := e.cni.Add(list, p.RT)
				adds = append(adds, time.Since(t0))
				require.NoError(b, err)
				pods = append(pods, p)
			}
			for _, p := range pods {
				t0 := time.Now()
				err := e.cni.Del(list, p.RT)
				dels = append(dels, time.Since(t0))
				require.NoError(b, err)
			}
			b.StopTimer()
			for _, p := range nss {
				nettest.CloseNetNS(p.NS)
			}
			b.ReportMetric(percentile(adds, 0.5), "add-p50-ms")
			b.ReportMetric(percentile(adds, 0.99), "add-p99-ms")
			b.ReportMetric(percentile(dels, 0.5), "del-p50-ms")
			b.ReportMetric(percentile(dels, 0.99), "del-p99-ms")
		})
	}
}

var rttRE = regexp.MustCompile(`= [\d.]+/([\d.]+)/`)

// BenchmarkRTT: same-node pod-to-pod round trips, ICMP (ping average) and
// TCP request/response of one byte, ebpf-cni against the bridge.
func BenchmarkRTT(b *testing.B) {
	for _, kind := range []string{"ebpf-cni", "bridge"} {
		b.Run(kind, func(b *testing.B) {
			e := newBenchEnv(b)
			list := e.confList(netOpts{ipam: map[string]any{"type": "ebpf-ipam", "ranges": []any{
				[]any{map[string]any{"subnet": "10.244.0.0/16"}}}}})
			if kind == "bridge" {
				list = bridgeList(b, e)
			}
			a, err := e.cni.AddPod(list, "rtt-a", nil)
			require.NoError(b, err)
			defer e.cni.DelPod(list, a)
			c, err := e.cni.AddPod(list, "rtt-b", nil)
			require.NoError(b, err)
			defer e.cni.DelPod(list, c)

			out, err := nettest.Run(a.NS, "ping", "-n", "-q", "-c", "500", "-i", "0.002", c.IP(4).String())
			require.NoError(b, err, out)
			m := rttRE.FindStringSubmatch(out)
			require.NotNil(b, m, out)
			avg, _ := strconv.ParseFloat(m[1], 64)

			l, err := nettest.Listen(c.NS, c.IP(4))
			require.NoError(b, err)
			defer l.Close()
			conn, err := nettest.Dial(a.NS, l.Addr().String())
			require.NoError(b, err)
			defer conn.Close()
			buf := []byte{1}
			b.ResetTimer()
			for range b.N {
				if _, err := conn.Write(buf); err != nil {
					b.Fatal(err)
				}
				if _, err := conn.Read(buf); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(avg*1000, "ping-rtt-µs")
		})
	}
}
