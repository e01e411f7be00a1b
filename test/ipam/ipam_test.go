package ipam_test

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/errcode"
)

func mustParse(t *testing.T, ver string, b []byte) types.Result {
	t.Helper()
	r, err := version.NewResult(ver, b)
	require.NoError(t, err, "result does not parse as version %s: %s", ver, b)
	return r
}

const dualStack = `"ranges":[[{"subnet":"10.50.0.0/24"}],[{"subnet":"fd50::/64"}]],"routes":[{"dst":"0.0.0.0/0"},{"dst":"::/0"}]`

// Every verb, every spec version: the result has the shape of its version.
func TestAddCheckDelEveryVersion(t *testing.T) {
	for _, ver := range testutil.SpecVersions {
		t.Run(ver, func(t *testing.T) {
			e := newEnv(t)
			stdin := e.conf(ver, dualStack)
			out := e.run("ADD", "c1", stdin, "").Must(t)

			var raw map[string]any
			require.NoError(t, json.Unmarshal(out.Stdout, &raw))
			require.Equal(t, ver, raw["cniVersion"])
			if testutil.AtLeast(ver, "0.3.0") {
				require.Contains(t, raw, "ips")
				require.NotContains(t, raw, "ip4")
				ips := raw["ips"].([]any)
				require.Len(t, ips, 2)
				first := ips[0].(map[string]any)
				if testutil.AtLeast(ver, "1.0.0") {
					require.NotContains(t, first, "version", "1.0.0 dropped ips[].version")
				} else {
					require.Equal(t, "4", first["version"], "0.3.x and 0.4.0 carry ips[].version")
				}
			} else {
				require.Contains(t, raw, "ip4")
				require.Contains(t, raw, "ip6")
				require.NotContains(t, raw, "ips")
			}

			res := e.add("c1", stdin, "") // a repeated ADD returns the same addresses
			require.Equal(t, []string{"10.50.0.2", "fd50::2"}, ipsOf(res))
			require.Equal(t, "10.50.0.1", res.IPs[0].Gateway.String())
			require.Len(t, res.Routes, 2)

			if testutil.AtLeast(ver, "0.4.0") {
				check := e.conf(ver, dualStack, `"prevResult":`+string(out.Stdout))
				e.run("CHECK", "c1", check, "").Must(t)
			}
			if testutil.AtLeast(ver, "1.1.0") {
				e.run("STATUS", "", stdin, "").Must(t)
			}

			e.run("DEL", "c1", stdin, "").Must(t)
			e.run("DEL", "c1", stdin, "").Must(t) // idempotent
			e.requireNothingHeld()
		})
	}
}

func TestVersionListsEverySpec(t *testing.T) {
	e := newEnv(t)
	out := e.run("VERSION", "", []byte(`{"cniVersion":"1.1.0"}`), "").Must(t)
	var v struct {
		Supported []string `json:"supportedVersions"`
	}
	require.NoError(t, json.Unmarshal(out.Stdout, &v))
	require.Equal(t, testutil.SpecVersions, v.Supported)
}

// Bad input gets the right code, names the bad key, and leaves nothing.
func TestBadInput(t *testing.T) {
	e := newEnv(t)
	good := e.conf("1.0.0", `"subnet":"10.60.0.0/24"`)
	// One address is taken by another container first.
	e.add("holder", good, "IP=10.60.0.50")

	cases := []struct {
		name  string
		id    string
		stdin []byte
		args  string
		code  uint
		words string
	}{
		{"malformed json", "c", []byte(`{"cniVersion":"1.0.0","name":`), "", types.ErrDecodingFailure, ""},
		{"missing container id", "", good, "", types.ErrInvalidEnvironmentVariables, "CNI_CONTAINERID"},
		{"unknown version", "c", e.conf("9.9.9", `"subnet":"10.60.0.0/24"`), "", types.ErrIncompatibleCNIVersion, "incompatible"},
		{"prefix /33", "c", e.conf("1.0.0", `"subnet":"10.0.0.0/33"`), "", types.ErrInvalidNetworkConfig, "ipam.subnet"},
		{"rangeStart outside", "c", e.conf("1.0.0", `"subnet":"10.60.0.0/24","rangeStart":"10.61.0.1"`), "", types.ErrInvalidNetworkConfig, "ipam.rangeStart"},
		{"requested outside ranges", "c", good, "IP=192.168.77.1", errcode.AddressNotInRange, "192.168.77.1"},
		{"requested taken", "c", good, "IP=10.60.0.50", errcode.AddressInUse, "holder"},
		{"requested taken via runtimeConfig", "c", e.conf("1.0.0", `"subnet":"10.60.0.0/24"`, `"runtimeConfig":{"ips":["10.60.0.50"]}`), "", errcode.AddressInUse, "10.60.0.50"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := e.run("ADD", tc.id, tc.stdin, tc.args)
			cerr := out.Error(t)
			require.Equal(t, tc.code, cerr.Code, "msg: %s", cerr.Msg)
			require.Contains(t, cerr.Msg+" "+cerr.Details, tc.words)
			addrs, records := e.held()
			require.Equal(t, []string{"10.60.0.50"}, addrs, "only the holder's address may be allocated")
			require.Len(t, records, 1)
		})
	}
}

// A dual-stack ADD whose second range set fails releases the first.
func TestFailedMultiRangeAddReleasesWhatItTook(t *testing.T) {
	e := newEnv(t)
	stdin := e.conf("1.0.0", `"ranges":[[{"subnet":"10.70.0.0/24"}],[{"subnet":"fd70::/64"}]]`)
	e.add("holder", stdin, "IP=fd70::5")
	before, _ := e.held()

	out := e.run("ADD", "c2", e.conf("1.0.0", `"ranges":[[{"subnet":"10.70.0.0/24"}],[{"subnet":"fd70::/64"}]]`, `"runtimeConfig":{"ips":["fd70::5"]}`), "")
	require.Equal(t, errcode.AddressInUse, out.Error(t).Code)
	after, records := e.held()
	require.Equal(t, before, after, "the IPv4 address taken before the IPv6 failure must be released")
	require.Len(t, records, 1)
}

func TestRequestedAddressesFromEverySource(t *testing.T) {
	e := newEnv(t)
	keys := `"ranges":[[{"subnet":"10.80.0.0/24"}],[{"subnet":"fd80::/64"}]]`
	require.Equal(t, []string{"10.80.0.77", "fd80::2"}, ipsOf(e.add("a", e.conf("1.0.0", keys), "IgnoreUnknown=1;IP=10.80.0.77")))
	require.Equal(t, []string{"10.80.0.78", "fd80::78"}, ipsOf(e.add("b", e.conf("1.0.0", keys, `"args":{"cni":{"ips":["10.80.0.78","fd80::78"]}}`), "")))
	require.Equal(t, []string{"10.80.0.79", "fd80::3"}, ipsOf(e.add("c", e.conf("1.0.0", keys, `"runtimeConfig":{"ips":["10.80.0.79/24"]}`), "")))
}

func TestIPRangesReplaceConfiguredRanges(t *testing.T) {
	e := newEnv(t)
	res := e.add("a", e.conf("1.0.0", `"subnet":"10.90.0.0/24"`, `"runtimeConfig":{"ipRanges":[[{"subnet":"10.91.0.0/24","rangeStart":"10.91.0.100"}]]}`), "")
	require.Equal(t, []string{"10.91.0.100"}, ipsOf(res))
}

// Round-robin: a released address is not handed out again at once while
// the network holds addresses; once it holds none, its cursor is forgotten
// with the rest of its bookkeeping and allocation starts over.
func TestRoundRobin(t *testing.T) {
	e := newEnv(t)
	stdin := e.conf("1.0.0", `"subnet":"10.100.0.0/29"`) // .2-.6 usable, .1 gateway
	require.Equal(t, []string{"10.100.0.2"}, ipsOf(e.add("a", stdin, "")))
	e.run("DEL", "a", stdin, "").Must(t)
	require.Equal(t, []string{"10.100.0.2"}, ipsOf(e.add("a", stdin, "")), "the network held nothing: it starts over")
	require.Equal(t, []string{"10.100.0.3"}, ipsOf(e.add("b", stdin, "")))
	e.run("DEL", "b", stdin, "").Must(t)
	var got []string
	for _, id := range []string{"c", "d", "e", "f"} {
		got = append(got, ipsOf(e.add(id, stdin, ""))...)
	}
	require.Equal(t, []string{"10.100.0.4", "10.100.0.5", "10.100.0.6", "10.100.0.3"}, got, "wraps round, skipping the gateway and what is held")
	cerr := e.run("ADD", "g", stdin, "").Error(t)
	require.Equal(t, errcode.RangeFull, cerr.Code)
	require.Contains(t, cerr.Msg, "no free address")
}

// 200 ADDs from 16 parallel processes into one /24: 200 distinct addresses.
func TestParallelAdds(t *testing.T) {
	e := newEnv(t)
	stdin := e.conf("1.0.0", `"subnet":"10.110.0.0/24"`)
	const n, workers = 200, 16
	addOne := func(id string) (string, error) {
		out := e.run("ADD", id, stdin, "")
		if out.ExitCode != 0 {
			return "", fmt.Errorf("ADD %s: %s %s", id, out.Stdout, out.Stderr)
		}
		var v struct {
			IPs []struct{ Address string } `json:"ips"`
		}
		if err := json.Unmarshal(out.Stdout, &v); err != nil || len(v.IPs) != 1 {
			return "", fmt.Errorf("ADD %s: bad result %s", id, out.Stdout)
		}
		return v.IPs[0].Address, nil
	}
	parallel := func(ids []string) []string {
		var (
			mu   sync.Mutex
			got  []string
			errs []error
			wg   sync.WaitGroup
		)
		ch := make(chan string)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for id := range ch {
					a, err := addOne(id)
					mu.Lock()
					if err != nil {
						errs = append(errs, err)
					} else {
						got = append(got, a)
					}
					mu.Unlock()
				}
			}()
		}
		for _, id := range ids {
			ch <- id
		}
		close(ch)
		wg.Wait()
		require.Empty(t, errs)
		return got
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("ctr%03d", i)
	}
	got := parallel(ids)
	require.Len(t, got, n)
	seen := map[string]bool{}
	_, subnet, _ := net.ParseCIDR("10.110.0.0/24")
	for _, a := range got {
		require.False(t, seen[a], "%s handed out twice", a)
		seen[a] = true
		ip, _, err := net.ParseCIDR(a)
		require.NoError(t, err)
		require.True(t, subnet.Contains(ip))
		require.NotEqual(t, "10.110.0.1", ip.String(), "gateway handed out")
	}
	addrs, records := e.held()
	require.Len(t, addrs, n)
	require.Len(t, records, n)

	// Release half, then fill the range to the brim from new containers.
	for i := 0; i < n; i += 2 {
		e.run("DEL", ids[i], stdin, "").Must(t)
	}
	var more []string
	for i := 0; i < 253-n/2; i++ {
		more = append(more, fmt.Sprintf("new%03d", i))
	}
	got2 := parallel(more)
	all := map[string]bool{}
	for i := 1; i < n; i += 2 {
		all[ipsOf(e.add(ids[i], stdin, ""))[0]] = true // repeated ADD: same address
	}
	for _, a := range got2 {
		ip, _, _ := net.ParseCIDR(a)
		require.False(t, all[ip.String()], "%s handed out twice", ip)
		all[ip.String()] = true
	}
	require.Len(t, all, 253, "the whole /24 but the network, gateway and broadcast")

	cerr := e.run("ADD", "one-too-many", stdin, "").Error(t)
	require.Equal(t, errcode.RangeFull, cerr.Code)
	require.Contains(t, cerr.Msg, "10.110.0.1-10.110.0.254")
	st := e.run("STATUS", "", e.conf("1.1.0", `"subnet":"10.110.0.0/24"`), "").Error(t)
	require.Equal(t, types.ErrPluginNotAvailable, st.Code)
	require.Contains(t, st.Msg, "253 of 253")
}

func TestGCKeepsExactlyTheValidAttachments(t *testing.T) {
	e := newEnv(t)
	stdin := e.conf("1.1.0", dualStack)
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		e.add(id, stdin, "")
	}
	keep := map[string][]string{}
	for _, id := range []string{"b", "d"} {
		keep[id] = ipsOf(e.add(id, stdin, ""))
	}
	gc := e.conf("1.1.0", dualStack, `"cni.dev/valid-attachments":[{"containerID":"b","ifname":"eth0"},{"containerID":"d","ifname":"eth0"}]`)
	e.run("GC", "", gc, "").Must(t)
	addrs, records := e.held()
	want := append(append([]string{}, keep["b"]...), keep["d"]...)
	require.ElementsMatch(t, want, addrs)
	require.ElementsMatch(t, []string{"b:eth0", "d:eth0"}, records)

	// An empty list releases everything.
	e.run("GC", "", e.conf("1.1.0", dualStack, `"cni.dev/valid-attachments":[]`), "").Must(t)
	e.requireNothingHeld()
}

func TestCheckNamesWhatIsWrong(t *testing.T) {
	e := newEnv(t)
	stdin := e.conf("1.0.0", `"subnet":"10.120.0.0/24"`)
	out := e.run("ADD", "a", stdin, "").Must(t)
	e.run("CHECK", "a", e.conf("1.0.0", `"subnet":"10.120.0.0/24"`, `"prevResult":`+string(out.Stdout)), "").Must(t)

	other := strings.Replace(string(out.Stdout), "10.120.0.2", "10.120.0.9", 1)
	cerr := e.run("CHECK", "a", e.conf("1.0.0", `"subnet":"10.120.0.0/24"`, `"prevResult":`+other), "").Error(t)
	require.Equal(t, errcode.AllocationMismatch, cerr.Code)
	require.Contains(t, cerr.Msg, "10.120.0.9")

	e.run("DEL", "a", stdin, "").Must(t)
	cerr = e.run("CHECK", "a", e.conf("1.0.0", `"subnet":"10.120.0.0/24"`, `"prevResult":`+string(out.Stdout)), "").Error(t)
	require.Equal(t, errcode.AllocationMismatch, cerr.Code)
	require.Contains(t, cerr.Msg, "holds no address")
}

func TestStatusFailsWithoutBPFFS(t *testing.T) {
	e := newEnv(t)
	e.bpfRoot = t.TempDir() // a plain directory, not bpffs
	cerr := e.run("STATUS", "", e.conf("1.1.0", `"subnet":"10.130.0.0/24"`), "").Error(t)
	require.Equal(t, types.ErrPluginNotAvailable, cerr.Code)
	require.Contains(t, cerr.Msg, "mount -t bpf")
	cerr = e.run("ADD", "a", e.conf("1.1.0", `"subnet":"10.130.0.0/24"`), "").Error(t)
	require.Equal(t, errcode.StateUnavailable, cerr.Code)
	require.Contains(t, cerr.Msg, "bpfRoot")
}

// bpffs remounted while the node is up: the maps come back empty, but no
// address held by a live attachment may be handed out again.
func TestRecoversAfterBPFFSRemount(t *testing.T) {
	e := newEnv(t)
	stdin := e.conf("1.0.0", `"subnet":"10.140.0.0/29"`) // .2-.6
	held := map[string]bool{}
	for _, id := range []string{"a", "b", "c"} {
		held[ipsOf(e.add(id, stdin, ""))[0]] = true
	}
	mnt := e.bpfRoot[:strings.LastIndex(e.bpfRoot, "/")]
	require.NoError(t, unix.Unmount(mnt, unix.MNT_DETACH))
	require.NoError(t, unix.Mount("bpf", mnt, "bpf", 0, ""))
	addrs, _ := e.held()
	require.Empty(t, addrs, "the new bpffs starts empty")

	// Fill the rest: only the two free addresses may come out.
	d := ipsOf(e.add("d", stdin, ""))[0]
	f := ipsOf(e.add("f", stdin, ""))[0]
	require.False(t, held[d] || held[f], "handed out a live attachment's address (%s, %s)", d, f)
	require.Equal(t, errcode.RangeFull, e.run("ADD", "g", stdin, "").Error(t).Code)
	addrs, records := e.held()
	require.Len(t, addrs, 5, "the map holds the restored and the new addresses")
	require.Len(t, records, 5)
	// The restored allocations are released by DEL as before.
	e.run("DEL", "a", stdin, "").Must(t)
	addrs, _ = e.held()
	require.Len(t, addrs, 4)
}

// Two networks never share state: the same attachment in each holds an
// address of each, allocated from the start of each network's range (a
// cursor each), and a DEL in one leaves the other's. (They share no range:
// TestNetworksSharingARange.)
func TestNetworksAreIndependent(t *testing.T) {
	e := newEnv(t)
	stdin := e.conf("1.0.0", `"subnet":"10.150.0.0/24"`)
	e.add("z", stdin, "")
	a := ipsOf(e.add("a", stdin, ""))
	require.Equal(t, []string{"10.150.0.3"}, a)
	e2 := *e
	e2.network = "othernet"
	other := e2.conf("1.0.0", `"subnet":"10.151.0.0/24"`)
	require.Equal(t, []string{"10.151.0.2"}, ipsOf(e2.add("a", other, "")), "the first address of its own range")
	e2.run("DEL", "a", other, "").Must(t)
	addrs, _ := e.held()
	require.Equal(t, []string{"10.150.0.2", "10.150.0.3"}, addrs)
}
