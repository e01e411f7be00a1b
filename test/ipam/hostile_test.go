package ipam_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/conflisttest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

// hostile is every range and requested address no pod may get, IPv4 and
// IPv6, on the simulated node (uplink 192.0.2.2/24, 2001:db8:ffff::2/64),
// with the key the error must name.
var hostile = []struct {
	name, ipam, top, args, key string
}{
	{"0.0.0.0/0", `"subnet":"0.0.0.0/0"`, "", "", "ipam.subnet"},
	{"::/0", `"ranges":[[{"subnet":"10.71.0.0/24"}],[{"subnet":"::/0"}]]`, "", "", "ipam.ranges[1][0].subnet"},
	{"loopback", `"ranges":[[{"subnet":"127.0.0.0/24"}]]`, "", "", "ipam.ranges[0][0].subnet"},
	{"loopback6", `"ranges":[[{"subnet":"::/127"}]]`, "", "", "ipam.ranges[0][0].subnet"},
	{"multicast", `"ranges":[[{"subnet":"10.71.0.0/24"},{"subnet":"239.1.0.0/16"}]]`, "", "", "ipam.ranges[0][1].subnet"},
	{"multicast6", `"ranges":[[{"subnet":"ff05::/64"}]]`, "", "", "ipam.ranges[0][0].subnet"},
	{"link-local", `"ranges":[[{"subnet":"169.254.0.0/16"}]]`, "", "", "ipam.ranges[0][0].subnet"},
	{"link-local6", `"ranges":[[{"subnet":"fe80::/64"}]]`, "", "", "ipam.ranges[0][0].subnet"},
	{"uplink subnet", `"ranges":[[{"subnet":"192.0.2.0/24"}]]`, "", "", "ipam.ranges[0][0].subnet"},
	{"uplink subnet6", `"ranges":[[{"subnet":"10.71.0.0/24"}],[{"subnet":"2001:db8:ffff::/64"}]]`, "", "", "ipam.ranges[1][0].subnet"},
	{"runtime ipRanges", `"subnet":"10.71.0.0/24"`, `"runtimeConfig":{"ipRanges":[[{"subnet":"192.0.0.0/16"}]]}`, "", "runtimeConfig.ipRanges[0][0].subnet"},

	{"ips loopback", `"subnet":"10.71.0.0/24"`, `"runtimeConfig":{"ips":["127.0.0.1"]}`, "", "runtimeConfig.ips"},
	{"ips multicast", `"subnet":"10.71.0.0/24"`, "", "IP=224.0.0.1", "CNI_ARGS IP"},
	{"ips pods' gateway", `"subnet":"10.71.0.0/24"`, "", "IP=169.254.1.1", "CNI_ARGS IP"},
	{"ips uplink address", `"subnet":"10.71.0.0/24"`, `"args":{"cni":{"ips":["192.0.2.2"]}}`, "", "args.cni.ips"},
	{"ips uplink address6", `"ranges":[[{"subnet":"fd71::/64"}]]`, `"runtimeConfig":{"ips":["2001:db8:ffff::2"]}`, "", "runtimeConfig.ips"},
	{"ips network address", `"subnet":"10.71.0.0/24"`, "", "IP=10.71.0.0", "CNI_ARGS IP"},
	{"ips broadcast", `"subnet":"10.71.0.0/24"`, "", "IP=10.71.0.255", "CNI_ARGS IP"},
	{"ips gateway", `"subnet":"10.71.0.0/24"`, "", "IP=10.71.0.1", "CNI_ARGS IP"},
	{"ips network address6", `"ranges":[[{"subnet":"fd71::/64","gateway":"fd71::9"}]]`, "", "IP=fd71::", "CNI_ARGS IP"},
	{"ips gateway6", `"ranges":[[{"subnet":"fd71::/64","gateway":"fd71::9"}]]`, `"runtimeConfig":{"ips":["fd71::9"]}`, "", "runtimeConfig.ips"},
	{"ips link-local6", `"ranges":[[{"subnet":"fd71::/64"}]]`, "", "IP=fe80::1", "CNI_ARGS IP"},
	{"ips unspecified", `"subnet":"10.71.0.0/24"`, "", "IP=0.0.0.0", "CNI_ARGS IP"},
	// An IPv4-mapped IPv6 address is not an IPv4 address: a request must
	// name the pod's address as it will have it, as a range must.
	{"ips v4-mapped", `"subnet":"10.71.0.0/24"`, `"runtimeConfig":{"ips":["::ffff:10.71.0.5"]}`, "", "runtimeConfig.ips"},
	{"ips v4-mapped args", `"subnet":"10.71.0.0/24"`, `"args":{"cni":{"ips":["::ffff:10.71.0.5/24"]}}`, "", "args.cni.ips"},
	{"ips v4-mapped CNI_ARGS", `"ranges":[[{"subnet":"10.71.0.0/24"}],[{"subnet":"fd71::/64"}]]`, "", "IP=::ffff:10.71.0.5", "CNI_ARGS IP"},
}

// TestHostileRangesAndAddresses is the table Must-hold of issue 27: each
// refused by ADD with code 7 naming the key, under every spec version, and
// nothing left behind (no allocation, no map entry, no state directory).
func TestHostileRangesAndAddresses(t *testing.T) {
	e := newEnv(t)
	for _, tc := range hostile {
		t.Run(tc.name, func(t *testing.T) {
			for _, ver := range testutil.SpecVersions {
				var top []string
				if tc.top != "" {
					top = append(top, tc.top)
				}
				stdin := e.conf(ver, tc.ipam, top...)
				cerr := e.run("ADD", "hostile", stdin, tc.args).Error(t)
				require.Equal(t, types.ErrInvalidNetworkConfig, cerr.Code, "%s: %s", ver, cerr.Msg)
				require.Contains(t, cerr.Msg, tc.key, ver)
				if strings.Contains(tc.name, "uplink") {
					// The node's address is named with its device, read
					// by index only for the message.
					require.Contains(t, cerr.Msg, "on uplink)", "%s: %s", ver, cerr.Msg)
				}
				readBookkeeping(t, e.bpfRoot, e.stateDir).requireOnly(t)
				e.run("DEL", "hostile", stdin, tc.args).Must(t)
				readBookkeeping(t, e.bpfRoot, e.stateDir).requireOnly(t)
			}
		})
	}
}

// The same ranges through ebpf-cni (ebpf-ipam in its process): the code 7
// reaches the runtime, and the node keeps nothing.
func TestHostileRangesThroughEbpfCNI(t *testing.T) {
	node := testutil.NewNode(t, false)
	for _, subnets := range [][]string{{"0.0.0.0/0"}, {"10.72.0.0/24", "::/0"}, {"192.0.2.0/25"}, {"fe80::/64"}} {
		list := node.List(t, conflisttest.Options{Name: "hostile", Subnets: subnets})
		_, err := node.CNI.AddPod(list, "hostile", nil)
		var cerr *types.Error
		require.ErrorAs(t, err, &cerr, "%v", subnets)
		require.Equal(t, uint(types.ErrInvalidNetworkConfig), cerr.Code, cerr.Msg)
		require.Contains(t, cerr.Msg, "ipam.ranges[", cerr.Msg)
		readBookkeeping(t, node.BPFRoot, node.StateDir).requireOnly(t)
	}
}

// A network name is the name of its state directory: over 255 bytes, or
// not a file name, it is a configuration error naming `name` (not a state
// error), for every verb, and leaves nothing; 255 bytes work.
func TestNetworkNames(t *testing.T) {
	e := newEnv(t)
	for _, bad := range []string{strings.Repeat("n", 256), "..", "a/b", ""} {
		e.network = bad
		stdin := e.conf("1.1.0", `"subnet":"10.73.0.0/24"`)
		for _, verb := range []string{"ADD", "DEL", "CHECK", "GC", "STATUS"} {
			cerr := e.run(verb, "c", stdin, "").Error(t)
			require.Equal(t, types.ErrInvalidNetworkConfig, cerr.Code, "%s %q: %s", verb, bad, cerr.Msg)
			// skel refuses names with characters the spec does not allow
			// before the plugin sees them; the plugin checks the length.
			require.Contains(t, cerr.Msg, "name", "%s %q", verb, bad)
			if len(bad) > 255 {
				require.Contains(t, cerr.Msg, "invalid name: network name of 256 bytes; at most 255", verb)
			}
		}
		readBookkeeping(t, e.bpfRoot, e.stateDir).requireOnly(t)
	}
	e.network = strings.Repeat("n", 255)
	stdin := e.conf("1.1.0", `"subnet":"10.73.0.0/24"`)
	require.Len(t, e.add("c", stdin, "").IPs, 1)
	readBookkeeping(t, e.bpfRoot, e.stateDir).requireOnly(t, e.network)
	e.run("DEL", "c", stdin, "").Must(t)
	readBookkeeping(t, e.bpfRoot, e.stateDir).requireOnly(t)
}

// An ipam.resolvConf that is not a regular file (a FIFO, which blocks an
// open for reading until a writer comes; /dev/urandom, which never ends)
// or larger than 64 KiB is refused by ADD and STATUS with code 7 naming
// the key, under every spec version, and leaves nothing: before, ADD hung
// there holding the node lock shared, and the node's last DEL waited.
func TestHostileResolvConf(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	big := filepath.Join(dir, "big.conf")
	require.NoError(t, os.WriteFile(big, []byte(strings.Repeat("# a long comment line of a resolv.conf\n", 2000)), 0o600))
	for _, tc := range []struct{ name, path, words string }{
		{"fifo", fifo, "not a regular file"},
		{"/dev/urandom", "/dev/urandom", "not a regular file"},
		{"over 64 KiB", big, "at most 65536"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, ver := range testutil.SpecVersions {
				stdin := e.conf(ver, fmt.Sprintf(`"subnet":"10.71.0.0/24","resolvConf":%q`, tc.path))
				verbs := []string{"ADD"}
				if ver == "1.1.0" {
					verbs = append(verbs, "STATUS")
				}
				for _, verb := range verbs {
					cerr := e.run(verb, "hostile", stdin, "").Error(t)
					require.Equal(t, types.ErrInvalidNetworkConfig, cerr.Code, "%s %s: %s", verb, ver, cerr.Msg)
					require.Contains(t, cerr.Msg, "ipam.resolvConf", verb, ver)
					require.Contains(t, cerr.Msg, tc.words, verb, ver)
					readBookkeeping(t, e.bpfRoot, e.stateDir).requireOnly(t)
				}
				e.run("DEL", "hostile", stdin, "").Must(t)
				readBookkeeping(t, e.bpfRoot, e.stateDir).requireOnly(t)
			}
		})
	}
}

// Two networks of one node may not share addresses: each allocates on its
// own, so the second's ADD took an address the first's pod held and failed
// only in ebpf-cni, with code 115, after IPAM. A network whose ranges
// overlap those of another that holds addresses on the node is refused by
// ADD (code 7 naming the range's key, under every spec version) and STATUS
// (code 50), both naming the two networks and the ranges; it leaves
// nothing, and the first network is untouched. Once the first holds
// nothing, the second may have the range.
func TestNetworksSharingARange(t *testing.T) {
	e := newEnv(t)
	e.network = "first"
	first := e.conf("1.1.0", `"ranges":[[{"subnet":"10.74.0.0/24"}],[{"subnet":"fd74::/64","rangeEnd":"fd74::ff"}]]`)
	require.Equal(t, []string{"10.74.0.2", "fd74::2"}, ipsOf(e.add("a", first, "")))
	for _, tc := range []struct{ name, ipam, top, key, theirs string }{
		{"same subnet", `"subnet":"10.74.0.0/24"`, "", "ipam.subnet", "10.74.0.1-10.74.0.254 (10.74.0.0/24)"},
		{"inside", `"ranges":[[{"subnet":"10.75.0.0/24"},{"subnet":"10.74.0.128/25"}]]`, "", "ipam.ranges[0][1]", "10.74.0.1-10.74.0.254"},
		{"around", `"ranges":[[{"subnet":"10.74.0.0/16"}]]`, "", "ipam.ranges[0][0]", "10.74.0.1-10.74.0.254"},
		{"IPv6", `"ranges":[[{"subnet":"10.75.0.0/24"}],[{"subnet":"fd74::/120","rangeStart":"fd74::f0"}]]`, "", "ipam.ranges[1][0]", "fd74::1-fd74::ff (fd74::/64)"},
		{"runtime ipRanges", `"subnet":"10.75.0.0/24"`, `"runtimeConfig":{"ipRanges":[[{"subnet":"10.74.0.0/24","rangeStart":"10.74.0.200"}]]}`, "runtimeConfig.ipRanges[0][0]", "10.74.0.1-10.74.0.254"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.network = "second"
			var top []string
			if tc.top != "" {
				top = append(top, tc.top)
			}
			check := func(verb, ver, msg string) {
				t.Helper()
				for _, w := range []string{tc.key, `network "second"`, `network "first"`, tc.theirs} {
					require.Contains(t, msg, w, "%s %s", verb, ver)
				}
				readBookkeeping(t, e.bpfRoot, e.stateDir).requireOnly(t, "first")
			}
			for _, ver := range testutil.SpecVersions {
				stdin := e.conf(ver, tc.ipam, top...)
				cerr := e.run("ADD", "b", stdin, "").Error(t)
				require.Equal(t, types.ErrInvalidNetworkConfig, cerr.Code, "%s: %s", ver, cerr.Msg)
				check("ADD", ver, cerr.Msg)
				e.run("DEL", "b", stdin, "").Must(t)
				check("DEL", ver, cerr.Msg)
			}
			cerr := e.run("STATUS", "", e.conf("1.1.0", tc.ipam, top...), "").Error(t)
			require.Equal(t, types.ErrPluginNotAvailable, cerr.Code, cerr.Msg)
			check("STATUS", "1.1.0", cerr.Msg)

			e.network = "first"
			addrs, records := e.held()
			require.Equal(t, []string{"10.74.0.2", "fd74::2"}, addrs, "the first network's addresses")
			require.Equal(t, []string{"a:eth0"}, records)
		})
	}
	e.network = "first"
	e.run("STATUS", "", first, "").Must(t)
	require.Equal(t, []string{"10.74.0.3", "fd74::3"}, ipsOf(e.add("c", first, "")), "the first network works on")
	e.run("DEL", "c", first, "").Must(t)
	e.run("DEL", "a", first, "").Must(t)
	readBookkeeping(t, e.bpfRoot, e.stateDir).requireOnly(t)

	e.network = "second"
	second := e.conf("1.1.0", `"subnet":"10.74.0.0/24"`)
	e.run("STATUS", "", second, "").Must(t)
	require.Equal(t, []string{"10.74.0.2"}, ipsOf(e.add("b", second, "")), "the first holds nothing: the range is free")
	e.run("DEL", "b", second, "").Must(t)
	readBookkeeping(t, e.bpfRoot, e.stateDir).requireOnly(t)
}

// The same through ebpf-cni, ebpf-ipam in its process: the second
// network's ADD is code 7 before anything is made (it was 115 once the
// veth and the endpoint's entries were), its STATUS code 50.
func TestNetworksSharingARangeThroughEbpfCNI(t *testing.T) {
	node := testutil.NewNode(t, false)
	first := node.List(t, conflisttest.Options{Name: "first"})
	a, err := node.CNI.AddPod(first, "a", nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = node.CNI.DelPod(first, a) })
	second := node.List(t, conflisttest.Options{Name: "second"})
	p, err := node.CNI.AddPod(second, "b", nil)
	if err == nil {
		t.Cleanup(func() { _ = node.CNI.DelPod(second, p) })
	}
	for verb, err := range map[string]error{"ADD": err, "STATUS": node.CNI.Status(second)} {
		var cerr *types.Error
		require.ErrorAs(t, err, &cerr, verb)
		want := uint(types.ErrInvalidNetworkConfig)
		if verb == "STATUS" {
			want = types.ErrPluginNotAvailable
		}
		require.Equal(t, want, cerr.Code, "%s: %s", verb, cerr.Msg)
		for _, w := range []string{"ipam.ranges[0][0]", `network "second"`, `network "first"`, "10.244.1.0/24"} {
			require.Contains(t, cerr.Msg, w, verb)
		}
		readBookkeeping(t, node.BPFRoot, node.StateDir).requireOnly(t, "first")
	}
	require.NoError(t, node.CNI.Status(first))
	require.NoError(t, node.CNI.Check(first, a.RT))
}
