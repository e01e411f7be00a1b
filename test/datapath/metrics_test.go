package datapath_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/nodetest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// metricsServer runs the agent's metrics handler on the node's loopback
// (in the node's network namespace, as the agent on a host network) and
// scrapes it over HTTP from there.
type metricsServer struct {
	t      testing.TB
	node   ns.NetNS
	addr   string
	client *http.Client
}

func (e *env) startMetrics() *metricsServer {
	e.t.Helper()
	var l net.Listener
	require.NoError(e.t, e.node.NS.Do(func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}))
	srv := &http.Server{Handler: agent.NewMetrics(nodetest.Handle(e.t, e.bpfRoot, e.stateDir), nil, nil).Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	e.t.Cleanup(func() { srv.Close() })
	s := &metricsServer{t: e.t, node: e.node.NS, addr: l.Addr().String()}
	s.client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := s.node.Do(func(ns.NetNS) error {
				var err error
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}}
	return s
}

// scrape is what /metrics answers, parsed.
type scrape map[string]*dto.MetricFamily

func (s *metricsServer) scrape() scrape {
	s.t.Helper()
	resp, err := s.client.Get("http://" + s.addr + "/metrics")
	require.NoError(s.t, err)
	defer resp.Body.Close()
	require.Equal(s.t, http.StatusOK, resp.StatusCode)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(s.t, err)
	return fams
}

// value sums the series of a metric whose labels include want: a
// counter's or gauge's value, a histogram's count.
func (s scrape) value(name string, want map[string]string) float64 {
	base := strings.TrimSuffix(name, "_count")
	f := s[name]
	if f == nil {
		f = s[base]
	}
	if f == nil {
		return 0
	}
	sum := 0.0
	for _, m := range f.Metric {
		ok := true
		for k, v := range want {
			found := false
			for _, l := range m.Label {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			ok = ok && found
		}
		if !ok {
			continue
		}
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		}
	}
	return sum
}

// delta is how much a series moved between two scrapes.
func delta(before, after scrape, name string, want map[string]string) float64 {
	return after.value(name, want) - before.value(name, want)
}

// addK8sPodCaps adds a pod the way kubelet's runtime does: its namespace
// and name in CNI_ARGS, caps as its runtimeConfig.
func (e *env) addK8sPodCaps(list *libcni.NetworkConfigList, id, namespace, name string, caps map[string]any) *nettest.Pod {
	e.t.Helper()
	return testutil.AddPodArgs(e.t, e.cni, list, id, caps, testutil.K8sArgs(namespace, name, ""))
}

// udpFlood sends n datagrams of size bytes from the pod to dst, without
// waiting for anything (an unconnected socket: no port unreachable gets
// back to it).
func udpFlood(t *testing.T, p ns.NetNS, dst net.IP, port, n, size int) {
	t.Helper()
	require.NoError(t, p.Do(func(ns.NetNS) error {
		c, err := net.ListenUDP("udp", nil)
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, size)
		for i := 0; i < n; i++ {
			if _, err := c.WriteTo(buf, &net.UDPAddr{IP: dst, Port: port}); err != nil {
				return err
			}
		}
		return nil
	}))
}

// TestMetricsDatapath: the agent's /metrics, scraped over HTTP on a
// simulated node, moves by what the traffic did: spoofed packets as
// drop_spoof_src egress on the spoofer's series (with its pod's labels)
// and the node's, a masqueraded flow as snat egress and rev_snat ingress,
// a hostPort connection as dnat ingress, a pod over its egress rate as
// drop_bw_egress; the maps those fill are reported with their capacity.
func TestMetricsDatapath(t *testing.T) {
	e := newEnv(t)
	cg := testutil.Cgroup(t)
	list := e.hostPortList("1.1.0", testutil.BestMode(), cg, map[string]any{"ipMasq": true,
		"capabilities": map[string]any{"mac": true, "portMappings": true, "bandwidth": true}})
	m := e.startMetrics()
	web := e.addK8sPod(list, "metrics-web", "shop", "web-0", mapping(8080, 80, "tcp"))
	client := e.addK8sPod(list, "metrics-client", "shop", "client-0")
	limited := e.addK8sPodCaps(list, "metrics-limited", "shop", "limited-0", map[string]any{"bandwidth": map[string]any{
		"egressRate": 1_000_000, "egressBurst": 20_000}})
	newServer(t, web.NS, 80)
	out, err := nettest.Ping(client.NS, web.IP(4), 1) // the gateway's ARP entry, before the spoofed packets
	require.NoError(t, err, out)

	first := m.scrape()
	require.Equal(t, 1.0, first.value("ebpf_cni_programs_current", nil), "this build's programs are pinned")
	require.Equal(t, 1.0, first.value("ebpf_cni_programs_pinned", map[string]string{"tag": features.Tag()}))
	attached := map[string]float64{}
	for _, h := range endpoint.HooksFor(testutil.PodDevice()) {
		attached[testutil.HookMode(h, testutil.BestMode())] += 3
	}
	for mode, n := range attached {
		require.Equal(t, n, first.value("ebpf_cni_endpoint_attachments", map[string]string{"mode": mode}), "two hooks for each of three pods: %s", mode)
	}
	require.Equal(t, 3.0, first.value("ebpf_cni_map_entries", map[string]string{"map": maps.CniMapEndpointDevs}))
	require.Equal(t, 3.0, first.value("ebpf_cni_map_entries", map[string]string{"map": maps.CniMapEndpointPods}))
	require.Equal(t, 16384.0, first.value("ebpf_cni_map_capacity", map[string]string{"map": maps.CniMapEndpointDevs}))
	require.Zero(t, first.value("ebpf_cni_scrape_errors", nil))
	names := agent.MetricNames()
	for name := range first {
		require.True(t, slices.Contains(names, name) || slices.Contains(names, name+"_count"), "%s is not in agent.MetricNames", name)
	}

	t.Run("spoofed", func(t *testing.T) {
		before := m.scrape()
		_, err := nettest.Run(client.NS, "ip", "addr", "add", "10.244.1.250/32", "dev", "eth0")
		require.NoError(t, err)
		const n = 5
		out, err := nettest.Run(client.NS, "ping", "-n", "-c", fmt.Sprint(n), "-i", "0.01", "-W", "1", "-I", "10.244.1.250", web.IP(4).String())
		require.Error(t, err, "spoofed ping got through: %s", out)
		after := m.scrape()
		spoof := map[string]string{"reason": "drop_spoof_src", "direction": "egress"}
		sent := float64(n)
		if testutil.PodDevice() == "netkit" {
			// A netkit pod's drop fails ping's send (ENOBUFS: the program
			// runs in its transmit), and ping sends that request again:
			// at least n drops, every one counted.
			sent = delta(before, after, "ebpf_cni_packets_total", spoof)
			require.GreaterOrEqual(t, sent, float64(n))
		}
		require.Equal(t, sent, delta(before, after, "ebpf_cni_packets_total", spoof), "node-wide")
		pod := map[string]string{"reason": "drop_spoof_src", "direction": "egress", "namespace": "shop", "pod": "client-0",
			"container_id": "metrics-client", "ifname": "eth0", "device": veth.HostName("metrics-client", "eth0")}
		require.Equal(t, sent, delta(before, after, "ebpf_cni_endpoint_packets_total", pod), "the spoofer's series")
		require.Equal(t, sent*98, delta(before, after, "ebpf_cni_endpoint_bytes_total", pod), "%v echo requests of 98 bytes (Ethernet, IPv4, ICMP, 56 of data)", sent)
		require.Zero(t, delta(before, after, "ebpf_cni_endpoint_packets_total", map[string]string{"reason": "drop_spoof_src", "pod": "web-0"}))
		require.Zero(t, delta(before, after, "ebpf_cni_packets_total", map[string]string{"reason": "drop_spoof_src", "direction": "ingress"}))
	})

	t.Run("masquerade", func(t *testing.T) {
		srv := newWorldServer(t, e.node.World)
		before := m.scrape()
		const n = 4
		out, err := nettest.Ping(client.NS, nettest.WorldIP4, n)
		require.NoError(t, err, out)
		c, err := dialFrom(client.NS, 0, nettest.WorldIP4, srv.port)
		require.NoError(t, err)
		c.Close()
		after := m.scrape()
		require.GreaterOrEqual(t, delta(before, after, "ebpf_cni_packets_total", map[string]string{"reason": "snat", "direction": "egress"}), float64(n+3),
			"echo requests and the TCP client's packets translated leaving the uplink")
		require.GreaterOrEqual(t, delta(before, after, "ebpf_cni_packets_total", map[string]string{"reason": "rev_snat", "direction": "ingress"}), float64(n+2),
			"replies translated back arriving on the uplink")
		require.Zero(t, delta(before, after, "ebpf_cni_packets_total", map[string]string{"reason": "snat", "direction": "ingress"}))
		require.GreaterOrEqual(t, after.value("ebpf_cni_map_entries", map[string]string{"map": maps.CniMapNat}), 2.0, "the flows' NAT entries")
		require.Positive(t, after.value("ebpf_cni_map_capacity", map[string]string{"map": maps.CniMapNat}))
	})

	t.Run("hostPort", func(t *testing.T) {
		before := m.scrape()
		c, err := dialFrom(e.node.World, 0, nettest.NodeIP4, 8080)
		require.NoError(t, err)
		c.Close()
		after := m.scrape()
		// SYN, ACK, the echoed data and its ACK at least; the client's FIN may still be on its way.
		require.GreaterOrEqual(t, delta(before, after, "ebpf_cni_packets_total", map[string]string{"reason": "dnat", "direction": "ingress"}), 3.0)
		require.GreaterOrEqual(t, delta(before, after, "ebpf_cni_endpoint_packets_total", map[string]string{"reason": "rev_dnat", "direction": "egress", "pod": "web-0"}), 2.0,
			"the pod's replies translated back as they leave it")
		require.GreaterOrEqual(t, after.value("ebpf_cni_map_entries", map[string]string{"map": maps.CniMapHostports}), 1.0)
	})

	t.Run("over its rate", func(t *testing.T) {
		before := m.scrape()
		const n = 200
		udpFlood(t, limited.NS, web.IP(4), 9, n, 1000)
		after := m.scrape()
		pod := map[string]string{"pod": "limited-0", "namespace": "shop", "direction": "egress"}
		dropped := delta(before, after, "ebpf_cni_endpoint_packets_total", map[string]string{"reason": "drop_bw_egress", "pod": "limited-0", "direction": "egress"})
		// 200 kB at 1 Mbit/s with a 20 kbit burst: most of them.
		require.Greater(t, dropped, float64(n/2))
		require.GreaterOrEqual(t, delta(before, after, "ebpf_cni_endpoint_packets_total", pod), float64(n), "every datagram counted, passed or dropped")
		require.GreaterOrEqual(t, delta(before, after, "ebpf_cni_packets_total", map[string]string{"reason": "drop_bw_egress", "direction": "egress"}), dropped)
	})

	t.Run("device slots", func(t *testing.T) {
		slots := map[string]string{"map": maps.CniMapDeviceSlots}
		before := m.scrape()
		owned := e.slotOwners()
		inUse := 0
		for _, n := range owned {
			inUse += n
		}
		// The pods' host veths and the uplink have counted packets.
		require.GreaterOrEqual(t, inUse, 4)
		require.Equal(t, float64(inUse), before.value("ebpf_cni_map_entries", slots), "the slots a device owns, not the array's size")
		require.Equal(t, float64(maps.CniDevSlotConstDEV_SLOTS), before.value("ebpf_cni_map_capacity", slots))
		gone := owned[uint32(e.hostIndex(limited))]
		require.Positive(t, gone, "the rate-limited pod's veth counts in a slot")
		require.NoError(t, e.cni.DelPod(list, limited))
		after := m.scrape()
		require.Equal(t, float64(inUse-gone), after.value("ebpf_cni_map_entries", slots), "DEL frees the pod's slot")
	})
}

// slotOwners reads device_slots: ifindex -> the slots it owns.
func (e *env) slotOwners() map[uint32]int {
	e.t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(maps.Dir(e.bpfRoot), maps.CniMapDeviceSlots), &ebpf.LoadPinOptions{ReadOnly: true})
	require.NoError(e.t, err)
	defer m.Close()
	out := map[uint32]int{}
	var slot, ifindex uint32
	it := m.Iterate()
	for it.Next(&slot, &ifindex) {
		if ifindex != 0 {
			out[ifindex]++
		}
	}
	require.NoError(e.t, it.Err())
	return out
}

// TestMetricsCalls: under every spec version, the agent counts the calls
// the plugin makes from its call record: K ADDs and K DELs in the call
// histograms and the phase histograms, a refused ADD under its CNI error
// code, a STATUS where the version has it.
func TestMetricsCalls(t *testing.T) {
	const k = 3
	for _, v := range testutil.SpecVersions {
		t.Run(v, func(t *testing.T) {
			e := newEnv(t)
			list := e.confList(netOpts{version: v})
			bad := e.confList(netOpts{version: v, extra: map[string]any{"attachMode": "sideways"}})
			m := e.startMetrics()
			before := m.scrape()
			var pods []*nettest.Pod
			for i := 0; i < k; i++ {
				p, err := e.cni.AddPod(list, fmt.Sprintf("calls-%d", i), nil)
				require.NoError(t, err)
				pods = append(pods, p)
			}
			_, err := e.cni.AddPod(bad, "calls-bad", nil)
			require.ErrorContains(t, err, "attachMode")
			for _, p := range pods {
				require.NoError(t, e.cni.DelPod(list, p))
			}
			status := 0.0
			if testutil.AtLeast(v, "1.1.0") {
				require.NoError(t, e.cni.Status(list))
				status = 1
			}
			after := m.scrape()

			add := map[string]string{"verb": "ADD"}
			require.Equal(t, float64(k+1), delta(before, after, "ebpf_cni_cni_call_duration_seconds_count", add), "every ADD timed, the refused one too")
			require.Equal(t, float64(k), delta(before, after, "ebpf_cni_cni_calls_total", map[string]string{"verb": "ADD", "code": "0"}))
			require.Equal(t, 1.0, delta(before, after, "ebpf_cni_cni_calls_total", map[string]string{"verb": "ADD", "code": "7"}), "invalid configuration")
			require.Equal(t, float64(k), delta(before, after, "ebpf_cni_cni_phase_duration_seconds_count", map[string]string{"verb": "ADD", "phase": "programs"}),
				"the phases of the ADDs that got that far")
			require.Equal(t, float64(k+1), delta(before, after, "ebpf_cni_cni_phase_duration_seconds_count", map[string]string{"verb": "ADD", "phase": "start"}))
			require.Equal(t, float64(k), delta(before, after, "ebpf_cni_cni_calls_total", map[string]string{"verb": "DEL", "code": "0"}))
			require.Equal(t, float64(k), delta(before, after, "ebpf_cni_cni_call_duration_seconds_count", map[string]string{"verb": "DEL"}))
			require.Equal(t, status, delta(before, after, "ebpf_cni_cni_calls_total", map[string]string{"verb": "STATUS", "code": "0"}))
			require.Zero(t, after.value("ebpf_cni_cni_record_errors_total", nil))
		})
	}
}

// TestMetricsRepair: a STATUS that mends the node (an endpoint record
// lost with the stateDir's files, rebuilt from the kernel) is counted in
// ebpf_cni_heal_repairs_total and dated by
// ebpf_cni_last_repair_timestamp_seconds; a STATUS with nothing to mend
// moves neither.
func TestMetricsRepair(t *testing.T) {
	e := newEnv(t)
	list := e.confList(netOpts{version: "1.1.0"})
	p := e.addPod(list, "repair-a")
	m := e.startMetrics()
	require.NoError(t, e.cni.Status(list))
	before := m.scrape()
	require.Zero(t, before.value("ebpf_cni_heal_repairs_total", nil), "nothing to mend")
	require.Nil(t, before["ebpf_cni_last_repair_timestamp_seconds"])

	require.NoError(t, os.Remove(filepath.Join(e.stateDir, "endpoints", veth.HostName(p.RT.ContainerID, p.RT.IfName)+".json")))
	start := time.Now()
	require.NoError(t, e.cni.Status(list))
	after := m.scrape()
	require.Equal(t, 1.0, delta(before, after, "ebpf_cni_heal_repairs_total", map[string]string{"verb": "STATUS"}), "the record rebuilt")
	require.Equal(t, 1, e.records())
	require.GreaterOrEqual(t, after.value("ebpf_cni_last_repair_timestamp_seconds", nil), float64(start.Unix()))
}
