package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMonitorLine: a table line names the time, type, pod, reason,
// direction, protocol with TCP flags and the addresses with their ports;
// JSON leaves out what the event did not hold.
func TestMonitorLine(t *testing.T) {
	at := time.Date(2026, 11, 24, 14, 2, 11, 532118000, time.UTC)
	drop := &MonitorEvent{Type: "drop", Time: at, Pod: &MonitorPod{Namespace: "team", Name: "spoofer"}, ContainerID: "c0ffee", IfName: "eth0",
		Reason: "drop_spoof_src", Direction: "egress", Protocol: "icmp", Src: "10.244.1.250", Dst: "10.244.1.3", Len: 84}
	kernel := &MonitorEvent{Type: "kernel-drop", Time: at, ContainerID: "0123456789abcdef", IfName: "eth0", Reason: "no_socket", Direction: "ingress",
		Protocol: "tcp", TCPFlags: "SYN", Src: "fd00::2", SrcPort: 41234, Dst: "fd00:244::3", DstPort: 80, Len: 80}
	uplink := &MonitorEvent{Type: "drop", Time: at, Device: "eth1", Reason: "drop_nat_no_port", Direction: "egress", Len: 60}
	var b strings.Builder
	for _, e := range []*MonitorEvent{drop, kernel, uplink} {
		b.WriteString(e.line() + "\n")
	}
	t.Log("\n" + b.String())
	lines := strings.Split(b.String(), "\n")
	require.Regexp(t, `^14:02:11\.532118  drop +team/spoofer +drop_spoof_src +egress +icmp +10\.244\.1\.250 -> 10\.244\.1\.3  len 84$`, lines[0])
	require.Regexp(t, `kernel-drop 0123456789ab/eth0 +no_socket +ingress tcp SYN +\[fd00::2\]:41234 -> \[fd00:244::3\]:80  len 80$`, lines[1])
	require.Regexp(t, `drop +eth1 +drop_nat_no_port +egress +- +-  len 60$`, lines[2])

	var out bytes.Buffer
	require.NoError(t, writeJSONLine(&Context{Stdout: &out}, drop))
	require.Equal(t, 1, strings.Count(out.String(), "\n"), "one object per line")
	var m map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &m))
	require.Equal(t, map[string]any{"namespace": "team", "name": "spoofer"}, m["pod"])
	for _, k := range []string{"srcPort", "dstPort", "tcpFlags", "device", "arp"} {
		require.NotContains(t, m, k)
	}
}

// TestMonitorFilter: --type and --pod select events.
func TestMonitorFilter(t *testing.T) {
	drop := &MonitorEvent{Type: "drop", Pod: &MonitorPod{Namespace: "team", Name: "web"}, ContainerID: "0123456789abcdef", IfName: "eth0"}
	flow := &MonitorEvent{Type: "flow-start", ContainerID: "fedcba9876543210", IfName: "eth0"}
	kernel := &MonitorEvent{Type: "kernel-drop", Device: "eth1"}
	cases := []struct {
		o    monitorOpts
		want []bool // drop, flow, kernel
	}{
		{monitorOpts{}, []bool{true, true, true}},
		{monitorOpts{typ: "drop"}, []bool{true, false, true}},
		{monitorOpts{typ: "flow"}, []bool{false, true, false}},
		{monitorOpts{pod: "team/web"}, []bool{true, false, false}},
		{monitorOpts{pod: "fedcba987654/eth0"}, []bool{false, true, false}},
		{monitorOpts{pod: "0123456789abcdef/eth0"}, []bool{true, false, false}},
	}
	for _, c := range cases {
		for i, e := range []*MonitorEvent{drop, flow, kernel} {
			require.Equal(t, c.want[i], c.o.wants(e), "%+v %s", c.o, e.Type)
		}
	}
}
