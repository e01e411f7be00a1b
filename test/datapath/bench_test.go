package datapath_test

import (
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
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
			b.ResetTimer()
			pingPong(b, conn)
			b.ReportMetric(avg*1000, "ping-rtt-µs")
		})
	}
}

// BenchmarkMasquerade: a pod talking to a host outside the node through
// masquerade, ebpf-cni (BPF conntrack/SNAT) against the bridge's ipMasq
// (iptables MASQUERADE): 1-byte TCP request/response (the ns/op), new
// connections per second, and iperf3 TCP throughput.
func BenchmarkMasquerade(b *testing.B) {
	for _, kind := range []string{"ebpf-cni", "bridge"} {
		b.Run(kind, func(b *testing.B) {
			e := newBenchEnv(b)
			list := e.confList(netOpts{extra: map[string]any{"ipMasq": true}, ipam: map[string]any{"type": "ebpf-ipam", "ranges": []any{
				[]any{map[string]any{"subnet": "10.244.0.0/16"}}}}})
			if kind == "bridge" {
				list = bridgeList(b, e)
				raw := map[string]any{}
				require.NoError(b, json.Unmarshal(list.Plugins[0].Bytes, &raw))
				raw["ipMasq"] = true
				raw["ipam"].(map[string]any)["routes"] = []any{map[string]any{"dst": "0.0.0.0/0"}}
				nb, err := json.Marshal(raw)
				require.NoError(b, err)
				list.Plugins[0].Bytes = nb
			}
			p, err := e.cni.AddPod(list, "masq-bench", nil)
			require.NoError(b, err)
			defer e.cni.DelPod(list, p)

			l, err := nettest.Listen(e.node.World, nettest.WorldIP4)
			require.NoError(b, err)
			defer l.Close()
			conn, err := nettest.Dial(p.NS, l.Addr().String())
			require.NoError(b, err)
			defer conn.Close()

			// Connections per second: connect, one byte each way, close.
			const conns = 500
			t0 := time.Now()
			for range conns {
				c, err := nettest.Dial(p.NS, l.Addr().String())
				require.NoError(b, err)
				require.NoError(b, nettest.Echo(c, "x"))
				c.Close()
			}
			cps := conns / time.Since(t0).Seconds()

			// Throughput: iperf3 from the pod to the outside host.
			srv := exec.Command("iperf3", "-s", "-1", "-B", nettest.WorldIP4.String(), "-p", "5299")
			require.NoError(b, e.node.World.Do(func(ns.NetNS) error { return srv.Start() }))
			defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
			time.Sleep(200 * time.Millisecond)
			out, err := nettest.Run(p.NS, "iperf3", "-c", nettest.WorldIP4.String(), "-p", "5299", "-t", "3", "-J")
			require.NoError(b, err, out)
			var res struct {
				End struct {
					SumReceived struct {
						BitsPerSecond float64 `json:"bits_per_second"`
					} `json:"sum_received"`
				} `json:"end"`
			}
			require.NoError(b, json.Unmarshal([]byte(out), &res))

			b.ResetTimer()
			pingPong(b, conn)
			b.StopTimer()
			b.ReportMetric(cps, "conn/s")
			b.ReportMetric(res.End.SumReceived.BitsPerSecond/1e9, "Gbit/s")
		})
	}
}

// pingPong sends one byte over conn and waits for it back, b.N times.
func pingPong(b *testing.B, conn net.Conn) {
	buf := []byte{1}
	for range b.N {
		if _, err := conn.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := conn.Read(buf); err != nil {
			b.Fatal(err)
		}
	}
}
