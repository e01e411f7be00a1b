package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHumanCount(t *testing.T) {
	for _, tc := range []struct {
		n    uint64
		want string
	}{
		{0, "0"}, {999, "999"}, {1000, "1.0k"}, {1234, "1.2k"}, {9949, "9.9k"}, {9950, "10k"}, {12345, "12k"},
		{999_499, "999k"}, {999_999, "1.0M"}, {3_400_000, "3.4M"}, {7_800_000_000, "7.8G"}, {1<<64 - 1, "18E"},
	} {
		require.Equal(t, tc.want, HumanCount(tc.n), "%d", tc.n)
	}
}

func TestHumanBytes(t *testing.T) {
	for _, tc := range []struct {
		n    uint64
		want string
	}{
		{0, "0 B"}, {512, "512 B"}, {1023, "1023 B"}, {1024, "1.0 KiB"}, {1536, "1.5 KiB"},
		{3_565_158, "3.4 MiB"}, {1<<20 - 1, "1.0 MiB"}, {12 << 30, "12 GiB"},
	} {
		require.Equal(t, tc.want, HumanBytes(tc.n), "%d", tc.n)
	}
}

func TestHumanAge(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0s"}, {45 * time.Second, "45s"}, {192 * time.Second, "3m12s"},
		{2*time.Hour + 5*time.Minute, "2h05m"}, {76 * time.Hour, "3d04h"},
	} {
		require.Equal(t, tc.want, HumanAge(tc.d), "%s", tc.d)
	}
}

// TestTableAlignment: every column starts at the same offset on every line,
// right-aligned columns end at the same offset, and no line has trailing
// blanks (also with multi-byte characters).
func TestTableAlignment(t *testing.T) {
	tb := &Table{Header: []string{"NAME", "COUNT", "NOTE"}, Right: map[int]bool{1: true}}
	tb.Row("a", "1", "short")
	tb.Row("longer-name", "12.3k", "")
	tb.Row("µs", "999", "last")
	var b bytes.Buffer
	require.NoError(t, tb.Write(&b))
	want := "" +
		"NAME         COUNT  NOTE\n" +
		"a                1  short\n" +
		"longer-name  12.3k\n" +
		"µs             999  last\n"
	require.Equal(t, want, b.String())
	for _, l := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
		require.Equal(t, strings.TrimRight(l, " "), l)
	}
}

// TestJSONFieldNames pins the JSON field names scripts rely on: renaming one
// is a breaking change and must show up here.
func TestJSONFieldNames(t *testing.T) {
	ep := &Endpoint{ContainerID: "c", IfName: "eth0", Network: "n", NetNS: "/run/netns/x", HostVeth: "ec0", HostIfIndex: 7,
		IPs: []string{"10.0.0.2"}, MAC: "0e:00:00:00:00:01", HostMAC: "0e:00:00:00:00:02",
		Attachments: []Attached{{Hook: "from_container", Mode: "tcx", RecordedMode: "tcx", ProgramIDs: []uint32{42}, ProgramTag: "v1-abc"}},
		Recorded:    true, InMaps: true, VethPresent: true, Problems: []string{}, Qdiscs: []string{"root tbf"}, ViaQdisc: true}
	var b bytes.Buffer
	require.NoError(t, writeJSON(&b, ep))
	require.JSONEq(t, `{"containerID":"c","ifname":"eth0","network":"n","netns":"/run/netns/x","hostVeth":"ec0","hostIfindex":7,
		"ips":["10.0.0.2"],"mac":"0e:00:00:00:00:01","hostMAC":"0e:00:00:00:00:02",
		"attachments":[{"hook":"from_container","mode":"tcx","recordedMode":"tcx","programIDs":[42],"programTag":"v1-abc"}],
		"recorded":true,"inMaps":true,"vethPresent":true,"problems":[],"qdiscs":["root tbf"],"viaQdisc":true}`, b.String())

	c := &countersOutput{
		Total: ReasonCounters{Reasons: map[string]CounterValue{"redirect": {3, 300}, "drop_spoof_src": {1, 100}}, Dropped: CounterValue{1, 100}},
		Endpoints: []*EndpointCounters{{ContainerID: "c", IfName: "eth0", HostVeth: "ec0", HostIfIndex: 7,
			ReasonCounters: ReasonCounters{Reasons: map[string]CounterValue{"redirect": {3, 300}}}}},
	}
	b.Reset()
	require.NoError(t, writeJSON(&b, c))
	require.JSONEq(t, `{"total":{"reasons":{"drop_spoof_src":{"packets":1,"bytes":100},"redirect":{"packets":3,"bytes":300}},"dropped":{"packets":1,"bytes":100}},
		"endpoints":[{"containerID":"c","ifname":"eth0","hostVeth":"ec0","hostIfindex":7,"reasons":{"redirect":{"packets":3,"bytes":300}},"dropped":{"packets":0,"bytes":0}}]}`, b.String())
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
	for _, k := range []string{"pass", "redirect", "fib_redirect", "arp_reply", "drop_spoof_src", "drop_spoof_mac", "drop_malformed", "drop_no_endpoint"} {
		require.Contains(t, rc.Reasons, k)
	}
}
