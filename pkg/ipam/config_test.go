package ipam

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/config"
	"github.com/ebpf-cni/ebpf-cni/pkg/errcode"
)

func conf(ipam string) []byte {
	return []byte(`{"cniVersion":"1.1.0","name":"n","type":"x","ipam":{"type":"ebpf-ipam",` + ipam + `}}`)
}

func TestParseConfigValid(t *testing.T) {
	cases := []struct {
		name       string
		stdin      []byte
		args       string
		start, end string // of the first range of the first set
		gateway    string
		sets       int
		requested  map[int]string
	}{
		{name: "shorthand defaults", stdin: conf(`"subnet":"10.1.0.0/24"`), start: "10.1.0.1", end: "10.1.0.254", gateway: "10.1.0.1", sets: 1},
		{name: "shorthand bounds", stdin: conf(`"subnet":"10.1.0.0/24","rangeStart":"10.1.0.10","rangeEnd":"10.1.0.20","gateway":"10.1.0.254"`),
			start: "10.1.0.10", end: "10.1.0.20", gateway: "10.1.0.254", sets: 1},
		{name: "ipv6 ends at last address", stdin: conf(`"subnet":"fd00:1::/120"`), start: "fd00:1::1", end: "fd00:1::ff", gateway: "fd00:1::1", sets: 1},
		{name: "dual stack", stdin: conf(`"ranges":[[{"subnet":"10.1.0.0/24"}],[{"subnet":"fd00:1::/64"}]]`), start: "10.1.0.1", end: "10.1.0.254", gateway: "10.1.0.1", sets: 2},
		{name: "ipRanges replace ranges", stdin: []byte(`{"cniVersion":"1.0.0","name":"n","ipam":{"type":"ebpf-ipam","subnet":"10.1.0.0/24"},"runtimeConfig":{"ipRanges":[[{"subnet":"10.7.0.0/16"}]]}}`),
			start: "10.7.0.1", end: "10.7.255.254", gateway: "10.7.0.1", sets: 1},
		{name: "requested from every source", stdin: []byte(`{"cniVersion":"1.0.0","name":"n","ipam":{"type":"ebpf-ipam","ranges":[[{"subnet":"10.1.0.0/24"}],[{"subnet":"10.2.0.0/24"}],[{"subnet":"fd00::/64"}]]},"args":{"cni":{"ips":["10.2.0.9/24"]}},"runtimeConfig":{"ips":["fd00::9"]}}`),
			args: "IgnoreUnknown=1;K8S_POD_NAME=p", start: "10.1.0.1", end: "10.1.0.254", gateway: "10.1.0.1", sets: 3,
			requested: map[int]string{1: "10.2.0.9", 2: "fd00::9"}},
		{name: "CNI_ARGS IP with runtimeConfig.ips", stdin: []byte(`{"cniVersion":"1.0.0","name":"n","ipam":{"type":"ebpf-ipam","ranges":[[{"subnet":"10.1.0.0/24"}],[{"subnet":"fd00::/64"}]]},"runtimeConfig":{"ips":["fd00::9"]}}`),
			args: "IgnoreUnknown=1;K8S_POD_NAME=p;IP=10.1.0.9", start: "10.1.0.1", end: "10.1.0.254", gateway: "10.1.0.1", sets: 2,
			requested: map[int]string{0: "10.1.0.9", 1: "fd00::9"}},
		// CONVENTIONS.md: args.cni.ips given, CNI_ARGS IP is ignored, even
		// when it names another range set or is not an address at all.
		{name: "args.cni.ips wins over CNI_ARGS IP", stdin: []byte(`{"cniVersion":"1.0.0","name":"n","ipam":{"type":"ebpf-ipam","ranges":[[{"subnet":"10.1.0.0/24"}],[{"subnet":"10.2.0.0/24"}]]},"args":{"cni":{"ips":["10.2.0.9"]}}}`),
			args: "IP=10.1.0.9", start: "10.1.0.1", end: "10.1.0.254", gateway: "10.1.0.1", sets: 2, requested: map[int]string{1: "10.2.0.9"}},
		{name: "args.cni.ips ignores a bad CNI_ARGS IP", stdin: []byte(`{"cniVersion":"1.0.0","name":"n","ipam":{"type":"ebpf-ipam","subnet":"10.1.0.0/24"},"args":{"cni":{"ips":["10.1.0.9"]}}}`),
			args: "IP=garbage", start: "10.1.0.1", end: "10.1.0.254", gateway: "10.1.0.1", sets: 1, requested: map[int]string{0: "10.1.0.9"}},
		{name: "empty args.cni.ips leaves CNI_ARGS IP", stdin: []byte(`{"cniVersion":"1.0.0","name":"n","ipam":{"type":"ebpf-ipam","subnet":"10.1.0.0/24"},"args":{"cni":{"ips":[]}}}`),
			args: "IP=10.1.0.9", start: "10.1.0.1", end: "10.1.0.254", gateway: "10.1.0.1", sets: 1, requested: map[int]string{0: "10.1.0.9"}},
		// What the runtimes send (their source: containerd's CRI
		// getPodCNILabels, podman's libnetwork/cni getRuntimeConfig,
		// cnitool's parseArgs).
		{name: "containerd", stdin: conf(`"subnet":"10.1.0.0/24"`),
			args:  "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=0123abcd;K8S_POD_UID=6a1c2e3f-1111-2222-3333-444455556666;IgnoreUnknown=1",
			start: "10.1.0.1", end: "10.1.0.254", gateway: "10.1.0.1", sets: 1},
		{name: "podman", stdin: conf(`"subnet":"10.1.0.0/24"`), args: "IgnoreUnknown=1;K8S_POD_NAME=web;MAC=02:00:00:00:00:01;IP=10.1.0.9",
			start: "10.1.0.1", end: "10.1.0.254", gateway: "10.1.0.1", sets: 1, requested: map[int]string{0: "10.1.0.9"}},
		{name: "cnitool MAC for the interface plugin", stdin: conf(`"subnet":"10.1.0.0/24"`), args: "MAC=02:00:00:00:00:01",
			start: "10.1.0.1", end: "10.1.0.254", gateway: "10.1.0.1", sets: 1},
		{name: "IgnoreUnknown spelled true", stdin: conf(`"subnet":"10.1.0.0/24"`), args: "IgnoreUnknown=True;FOO=bar;X=a=b;",
			start: "10.1.0.1", end: "10.1.0.254", gateway: "10.1.0.1", sets: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, _, err := ParseConfig(tc.stdin, tc.args)
			require.NoError(t, err)
			require.Len(t, c.RangeSets, tc.sets)
			r := c.RangeSets[0][0]
			require.Equal(t, tc.start, r.Start.String())
			require.Equal(t, tc.end, r.End.String())
			require.Equal(t, tc.gateway, r.Gateway.String())
			require.Len(t, c.Requested, len(tc.requested))
			for i, ip := range tc.requested {
				require.Equal(t, ip, c.Requested[i].String())
			}
			require.Equal(t, config.DefaultBPFRoot, c.BPFRoot)
			require.Equal(t, config.DefaultStateDir, c.StateDir)
		})
	}
}

func TestParseConfigErrors(t *testing.T) {
	cases := []struct {
		name  string
		stdin []byte
		args  string
		code  uint
		key   string // must appear in the message
	}{
		{"malformed json", []byte(`{"name":`), "", types.ErrDecodingFailure, "decoding"},
		{"no ipam section", []byte(`{"cniVersion":"1.0.0","name":"n"}`), "", types.ErrInvalidNetworkConfig, "ipam"},
		{"no ranges", conf(`"routes":[]`), "", types.ErrInvalidNetworkConfig, "ipam.ranges"},
		{"prefix too long", conf(`"subnet":"10.0.0.0/33"`), "", types.ErrInvalidNetworkConfig, "ipam.subnet"},
		{"not a cidr", conf(`"ranges":[[{"subnet":"banana"}]]`), "", types.ErrInvalidNetworkConfig, "ipam.ranges[0][0].subnet"},
		{"host bits", conf(`"subnet":"10.0.0.5/24"`), "", types.ErrInvalidNetworkConfig, "host bits"},
		{"too small", conf(`"subnet":"10.0.0.0/31"`), "", types.ErrInvalidNetworkConfig, "too small"},
		{"rangeStart outside", conf(`"subnet":"10.0.0.0/24","rangeStart":"10.0.1.5"`), "", types.ErrInvalidNetworkConfig, "ipam.rangeStart"},
		{"rangeEnd outside in ranges", conf(`"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"10.1.0.0/24","rangeEnd":"10.2.0.1"}]]`), "", types.ErrInvalidNetworkConfig, "ipam.ranges[1][0].rangeEnd"},
		{"rangeEnd is broadcast", conf(`"subnet":"10.0.0.0/24","rangeEnd":"10.0.0.255"`), "", types.ErrInvalidNetworkConfig, "ipam.rangeEnd"},
		{"start after end", conf(`"subnet":"10.0.0.0/24","rangeStart":"10.0.0.9","rangeEnd":"10.0.0.5"`), "", types.ErrInvalidNetworkConfig, "ipam.rangeEnd"},
		{"gateway outside", conf(`"subnet":"10.0.0.0/24","gateway":"10.9.9.9"`), "", types.ErrInvalidNetworkConfig, "ipam.gateway"},
		{"mixed families", conf(`"ranges":[[{"subnet":"10.0.0.0/24"},{"subnet":"fd00::/64"}]]`), "", types.ErrInvalidNetworkConfig, "ipam.ranges[0][1].subnet"},
		{"overlap across sets", conf(`"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"10.0.0.0/25"}]]`), "", types.ErrInvalidNetworkConfig, "ipam.ranges[1][0]"},
		{"overlap within a set, later first", conf(`"ranges":[[{"subnet":"10.0.1.0/24"},{"subnet":"10.0.0.0/16"}]]`), "", types.ErrInvalidNetworkConfig, "ipam.ranges[0][1]"},
		{"overlap past a short range", conf(`"ranges":[[{"subnet":"10.0.0.0/16"},{"subnet":"10.0.1.0/24"},{"subnet":"10.1.0.0/24"}]]`), "", types.ErrInvalidNetworkConfig, "ipam.ranges[0][1]"},
		{"overlap of a range far behind", conf(`"ranges":[[{"subnet":"10.0.0.0/16"},{"subnet":"10.0.1.0/24"}],[{"subnet":"10.0.200.0/24"}]]`), "", types.ErrInvalidNetworkConfig, "ipam.ranges[0][1]"},
		{"overlap of v6 ranges", conf(`"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"fd01::/64"},{"subnet":"fd01::/120"}]]`), "", types.ErrInvalidNetworkConfig, "ipam.ranges[1][1]"},
		{"overlap by rangeStart and rangeEnd", conf(`"ranges":[[{"subnet":"10.0.0.0/24","rangeEnd":"10.0.0.20"},{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.20"}]]`), "", types.ErrInvalidNetworkConfig, "ipam.ranges[0][1]"},
		{"both shorthand and ranges", conf(`"subnet":"10.0.0.0/24","ranges":[[{"subnet":"10.1.0.0/24"}]]`), "", types.ErrInvalidNetworkConfig, "ipam.subnet"},
		{"bad route", conf(`"subnet":"10.0.0.0/24","routes":[{"dst":"0.0.0.0"}]`), "", types.ErrInvalidNetworkConfig, "ipam.routes[0].dst"},
		{"bad route gw", conf(`"subnet":"10.0.0.0/24","routes":[{"dst":"0.0.0.0/0","gw":"x"}]`), "", types.ErrInvalidNetworkConfig, "ipam.routes[0].gw"},
		{"relative bpfRoot", conf(`"subnet":"10.0.0.0/24","bpfRoot":"bpf"`), "", types.ErrInvalidNetworkConfig, "ipam.bpfRoot"},
		{"relative stateDir", conf(`"subnet":"10.0.0.0/24","stateDir":"run"`), "", types.ErrInvalidNetworkConfig, "ipam.stateDir"},
		{"two v4 sets before 0.3.0", []byte(`{"cniVersion":"0.2.0","name":"n","ipam":{"type":"ebpf-ipam","ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"10.1.0.0/24"}]]}}`), "", types.ErrInvalidNetworkConfig, "one address per family"},
		{"bad CNI_ARGS IP", conf(`"subnet":"10.0.0.0/24"`), "IP=10.0.0.x", types.ErrInvalidEnvironmentVariables, "CNI_ARGS IP"},
		{"unknown CNI_ARGS key", conf(`"subnet":"10.0.0.0/24"`), "IP=10.0.0.5;K8S_POD_NAME=p", types.ErrInvalidEnvironmentVariables, `"K8S_POD_NAME=p"`},
		{"IgnoreUnknown off", conf(`"subnet":"10.0.0.0/24"`), "IgnoreUnknown=0;FOO=1", types.ErrInvalidEnvironmentVariables, `"FOO=1"`},
		{"bad IgnoreUnknown", conf(`"subnet":"10.0.0.0/24"`), "IgnoreUnknown=yes;FOO=1", types.ErrInvalidEnvironmentVariables, `"IgnoreUnknown=yes"`},
		{"pair without =", conf(`"subnet":"10.0.0.0/24"`), "IgnoreUnknown=1;IP", types.ErrInvalidEnvironmentVariables, `"IP"`},
		{"pair without key", conf(`"subnet":"10.0.0.0/24"`), "IgnoreUnknown=1;=10.0.0.5", types.ErrInvalidEnvironmentVariables, `"=10.0.0.5"`},
		{"bad args.cni.ips", []byte(`{"cniVersion":"1.0.0","name":"n","ipam":{"type":"ebpf-ipam","subnet":"10.0.0.0/24"},"args":{"cni":{"ips":["nope"]}}}`), "", types.ErrInvalidNetworkConfig, "args.cni.ips"},
		{"requested outside ranges", conf(`"subnet":"10.0.0.0/24"`), "IP=10.5.0.1", errcode.AddressNotInRange, "outside every configured range"},
		{"requested gateway-less duplicate set", []byte(`{"cniVersion":"1.0.0","name":"n","ipam":{"type":"ebpf-ipam","subnet":"10.0.0.0/24"},"runtimeConfig":{"ips":["10.0.0.7","10.0.0.8"]}}`), "", types.ErrInvalidNetworkConfig, "same range set"},
		{"bad ipRanges", []byte(`{"cniVersion":"1.0.0","name":"n","ipam":{"type":"ebpf-ipam","subnet":"10.0.0.0/24"},"runtimeConfig":{"ipRanges":[[{"subnet":"10.0.0.0/40"}]]}}`), "", types.ErrInvalidNetworkConfig, "runtimeConfig.ipRanges[0][0].subnet"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := ParseConfig(tc.stdin, tc.args)
			require.Error(t, err)
			var e *types.Error
			require.True(t, errors.As(err, &e), "not a CNI error: %v", err)
			require.Equal(t, tc.code, e.Code, e.Msg)
			require.True(t, strings.Contains(e.Msg, tc.key), "message %q does not name %q", e.Msg, tc.key)
		})
	}
}

func TestRangeSize(t *testing.T) {
	c, _, err := ParseConfig(conf(`"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"10.1.0.0/24","rangeStart":"10.1.0.10","rangeEnd":"10.1.0.19"}],[{"subnet":"fd00::/48"}],[{"subnet":"fd01::/64"}]]`), "")
	require.NoError(t, err)
	require.EqualValues(t, 253, c.RangeSets[0][0].Size(), ".1 to .254 without the gateway .1")
	require.EqualValues(t, 10, c.RangeSets[1][0].Size(), "the gateway .1 is outside .10-.19")
	require.Equal(t, ^uint64(0), c.RangeSets[2][0].Size(), "a /48 saturates")
	require.Equal(t, ^uint64(0)-1, c.RangeSets[3][0].Size(), "a /64: ::1 to the last address, less the gateway")
	require.True(t, c.RangeSets[1].Contains(net.ParseIP("10.1.0.15")))
	require.False(t, c.RangeSets[1].Contains(net.ParseIP("10.1.0.9")))
	require.False(t, c.RangeSets[0].Contains(net.ParseIP("fd00::1")))
}

func TestParseResolvConf(t *testing.T) {
	path := t.TempDir() + "/resolv.conf"
	require.NoError(t, writeFile(path, "# comment\nnameserver 10.0.0.53\nnameserver fd00::53\ndomain example.org\nsearch a.example b.example\noptions ndots:5 edns0\n"))
	c, _, err := ParseConfig(conf(`"subnet":"10.0.0.0/24","resolvConf":"`+path+`"`), "")
	require.NoError(t, err)
	require.Equal(t, []string{"10.0.0.53", "fd00::53"}, c.DNS.Nameservers)
	require.Equal(t, "example.org", c.DNS.Domain)
	require.Equal(t, []string{"a.example", "b.example"}, c.DNS.Search)
	require.Equal(t, []string{"ndots:5", "edns0"}, c.DNS.Options)

	_, _, err = ParseConfig(conf(`"subnet":"10.0.0.0/24","resolvConf":"/nonexistent/resolv.conf"`), "")
	var e *types.Error
	require.True(t, errors.As(err, &e))
	require.Equal(t, uint(types.ErrIOFailure), e.Code)
	require.Contains(t, e.Msg, "ipam.resolvConf")

	// What is not a regular file of at most MaxResolvConf bytes is a bad
	// key, refused before it is opened for reading (a FIFO would block).
	fifo := t.TempDir() + "/fifo"
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	big := t.TempDir() + "/big"
	require.NoError(t, writeFile(big, strings.Repeat("#", MaxResolvConf+1)))
	edge := t.TempDir() + "/edge"
	require.NoError(t, writeFile(edge, "nameserver 10.0.0.53\n"+strings.Repeat("#", MaxResolvConf-21)))
	_, _, err = ParseConfig(conf(`"subnet":"10.0.0.0/24","resolvConf":"`+edge+`"`), "")
	require.NoError(t, err, "exactly MaxResolvConf bytes")
	for path, words := range map[string]string{fifo: "a FIFO", "/dev/urandom": "a character device", t.TempDir(): "a directory", big: "at most 65536"} {
		_, _, err = ParseConfig(conf(`"subnet":"10.0.0.0/24","resolvConf":"`+path+`"`), "")
		require.True(t, errors.As(err, &e), "%s: %v", path, err)
		require.Equal(t, uint(types.ErrInvalidNetworkConfig), e.Code, e.Msg)
		require.Contains(t, e.Msg, "invalid ipam.resolvConf")
		require.Contains(t, e.Msg, words)
	}
}

func writeFile(path, s string) error { return os.WriteFile(path, []byte(s), 0o600) }

// 65,536 ranges (the configuration) parse, and one overlapping
// pair among them is found and named.
func TestManyRanges(t *testing.T) {
	var b strings.Builder
	for i := 0; i < 65536; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		a := 10<<24 | i<<2
		fmt.Fprintf(&b, `{"subnet":"%d.%d.%d.%d/30"}`, a>>24&255, a>>16&255, a>>8&255, a&255)
	}
	c, _, err := ParseConfig(conf(`"ranges":[[`+b.String()+`]]`), "")
	require.NoError(t, err)
	require.Len(t, c.RangeSets[0], 65536)
	_, _, err = ParseConfig(conf(`"ranges":[[`+b.String()+`],[{"subnet":"10.3.255.248/29"}]]`), "")
	require.ErrorContains(t, err, "ipam.ranges[1][0]")
	require.ErrorContains(t, err, "of ipam.ranges[0][65534]")
}
