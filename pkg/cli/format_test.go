package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/counters"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// TestJSONFieldNames pins the JSON field names scripts rely on: renaming one
// is a breaking change and must show up here.
func TestJSONFieldNames(t *testing.T) {
	ep := &Endpoint{ContainerID: "c", IfName: "eth0", Network: "n", NetNS: "/run/netns/x", HostVeth: "ec0", HostIfIndex: 7,
		IPs: []string{"10.0.0.2"}, MAC: "0e:00:00:00:00:01", HostMAC: "0e:00:00:00:00:02",
		Attachments: []Attached{{Hook: "from_container", Mode: "tcx", RecordedMode: "tcx", ProgramIDs: []uint32{42}, ProgramTag: "v1-abc"}},
		Recorded:    true, InMaps: true, VethPresent: true, Problems: []string{"a <problem> & more"}, Qdiscs: []string{"root tbf"}, ViaQdisc: true}
	var b bytes.Buffer
	// A feature's columns (view.Columns) add its field after the core's.
	feat := struct {
		State string `json:"state"`
	}{"enforced"}
	require.NoError(t, writeJSON(&b, []endpointJSON{{Endpoint: ep, features: []featureField{{"policy", feat}}}}))
	require.JSONEq(t, `[{"containerID":"c","ifname":"eth0","network":"n","netns":"/run/netns/x","hostVeth":"ec0","hostIfindex":7,
		"ips":["10.0.0.2"],"mac":"0e:00:00:00:00:01","hostMAC":"0e:00:00:00:00:02",
		"attachments":[{"hook":"from_container","mode":"tcx","recordedMode":"tcx","programIDs":[42],"programTag":"v1-abc"}],
		"recorded":true,"inMaps":true,"vethPresent":true,"problems":["a <problem> & more"],"qdiscs":["root tbf"],"viaQdisc":true,
		"policy":{"state":"enforced"}}]`, b.String())
	require.Contains(t, b.String(), `"viaQdisc": true,
    "policy": {
      "state": "enforced"
    }
  }
]`, "the features' fields last, indented as the rest")
	require.Contains(t, b.String(), `"a <problem> & more"`, "no HTML escaping, as view.WriteJSON")

	c := &countersOutput{
		Total: ReasonCounters{Reasons: map[string]CounterValue{"redirect": {3, 300}, "drop_spoof_src": {1, 100}}, Dropped: CounterValue{1, 100},
			Directions: map[string]map[string]CounterValue{"egress": {"redirect": {2, 200}}, "ingress": {"redirect": {1, 100}}}},
		Endpoints: []*EndpointCounters{{ContainerID: "c", IfName: "eth0", HostVeth: "ec0", HostIfIndex: 7,
			ReasonCounters: ReasonCounters{Reasons: map[string]CounterValue{"redirect": {3, 300}}}}},
	}
	b.Reset()
	require.NoError(t, writeJSON(&b, c))
	require.JSONEq(t, `{"total":{"reasons":{"drop_spoof_src":{"packets":1,"bytes":100},"redirect":{"packets":3,"bytes":300}},"dropped":{"packets":1,"bytes":100},
		"directions":{"egress":{"redirect":{"packets":2,"bytes":200}},"ingress":{"redirect":{"packets":1,"bytes":100}}}},
		"endpoints":[{"containerID":"c","ifname":"eth0","hostVeth":"ec0","hostIfindex":7,"reasons":{"redirect":{"packets":3,"bytes":300}},"dropped":{"packets":0,"bytes":0},"directions":null}]}`, b.String())
	// Stable bytes, not only equal JSON: map keys sorted, same output twice.
	first := b.String()
	b.Reset()
	require.NoError(t, writeJSON(&b, c))
	require.Equal(t, first, b.String())
	require.Less(t, strings.Index(first, "drop_spoof_src"), strings.Index(first, `"redirect"`))
}

// TestReasonCountersListEveryReason: JSON has every reason, zeros included,
// so a script can index any reason without checking for it.
func TestReasonCountersListEveryReason(t *testing.T) {
	rc := reasonCounters(nil)
	require.Len(t, rc.Reasons, len(reasons()))
	for _, d := range []string{"egress", "ingress"} {
		require.Len(t, rc.Directions[d], len(reasons()), d)
	}
	for _, k := range []string{"pass", "redirect", "fib_redirect", "arp_reply", "drop_spoof_src", "drop_spoof_mac", "drop_malformed", "drop_no_endpoint",
		"drop_policy_ingress", "drop_policy_egress"} {
		require.Contains(t, rc.Reasons, k)
	}
	// NetworkPolicy's denials are drops, each in the direction the
	// program saw the packet.
	rc = reasonCounters(map[maps.CniPktReason]counters.ByDir{
		maps.CniPktReasonREASON_DROP_POLICY_INGRESS: {counters.Egress: {Packets: 2, Bytes: 120}},
		maps.CniPktReasonREASON_DROP_POLICY_EGRESS:  {counters.Ingress: {Packets: 1, Bytes: 60}},
	})
	require.Equal(t, CounterValue{3, 180}, rc.Dropped)
	require.Equal(t, CounterValue{2, 120}, rc.Directions["egress"]["drop_policy_ingress"])
	require.Equal(t, CounterValue{1, 60}, rc.Directions["ingress"]["drop_policy_egress"])
	require.Equal(t, "drop: denied by ingress policy", counters.ReasonNames[maps.CniPktReasonREASON_DROP_POLICY_INGRESS])
	require.Equal(t, "drop: denied by egress policy", counters.ReasonNames[maps.CniPktReasonREASON_DROP_POLICY_EGRESS])
}

// TestTagVersion: status shows the version a program tag was built from,
// dots and all (the tag's own name cannot have them: bpffs).
func TestTagVersion(t *testing.T) {
	for tag, want := range map[string]string{
		"v0%2e1%2e0-58-g733ccab-75abc4033a78": "v0.1.0-58-g733ccab",
		"e2e-rollout-75abc4033a78":            "e2e-rollout",
		"dev-75abc4033a78":                    "dev",
	} {
		require.Equal(t, want, tagVersion(tag), tag)
	}
}
