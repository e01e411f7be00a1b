package ipam_test

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

// ebpf-ipam as the IPAM of Debian's reference bridge plugin: two pods in a
// simulated node get addresses from it and ping each other.
func TestReferenceBridgeWithEbpfIPAM(t *testing.T) {
	ref := testutil.RefPluginDir(t)
	supported := refVersions(t, filepath.Join(ref, "bridge"))
	for _, ver := range testutil.SpecVersions {
		t.Run(ver, func(t *testing.T) {
			if !slices.Contains(supported, ver) {
				t.Skipf("Debian's bridge plugin does not speak %s (it supports %v)", ver, supported)
			}
			e := newEnv(t)
			e.network = "brnet"
			node := testutil.NetNS(t)
			pods := []ns.NetNS{testutil.NetNS(t), testutil.NetNS(t)}
			stdin := e.conf(ver, `"subnet":"10.160.0.0/24"`, `"type":"bridge"`, `"bridge":"ebr0"`, `"isGateway":true`)
			// The "type" given twice: the later one (bridge) wins in Go's decoder
			// and in the plugin's; keep only one to be unambiguous.
			stdin = []byte(replaceOnce(string(stdin), `"type":"ebpf-cni",`, ""))

			call := func(cmd string, i int) *testutil.Output {
				var out *testutil.Output
				require.NoError(t, node.Do(func(ns.NetNS) error {
					out = testutil.Run(t, filepath.Join(ref, "bridge"), testutil.Call{
						Command: cmd, ContainerID: []string{"pod-a", "pod-b"}[i], NetNS: pods[i].Path(),
						IfName: "eth0", Path: filepath.Dir(e.bin) + ":" + ref, Stdin: stdin,
					})
					return nil
				}))
				return out
			}
			t.Cleanup(func() { call("DEL", 0); call("DEL", 1) })

			var addrs []string
			for i := range pods {
				out := call("ADD", i).Must(t)
				res, err := mustParse(t, ver, out.Stdout).GetAsVersion("1.0.0")
				require.NoError(t, err)
				addrs = append(addrs, ipsOf(asCurrent(t, res))...)
			}
			require.Equal(t, []string{"10.160.0.2", "10.160.0.3"}, addrs)

			// The bridge lives in the node namespace, not on this host.
			require.NoError(t, node.Do(func(ns.NetNS) error {
				_, err := netlink.LinkByName("ebr0")
				return err
			}))
			_, err := netlink.LinkByName("ebr0")
			require.Error(t, err, "bridge created outside the node namespace")

			require.NoError(t, pods[0].Do(func(ns.NetNS) error {
				out, err := exec.Command("ping", "-c", "2", "-W", "2", "-i", "0.2", addrs[1]).CombinedOutput()
				require.NoError(t, err, "ping pod-b from pod-a: %s", out)
				return nil
			}))

			call("DEL", 0).Must(t)
			call("DEL", 1).Must(t)
			call("DEL", 1).Must(t)
			e.requireNothingHeld()
		})
	}
}

// refVersions asks a reference plugin which spec versions it speaks.
func refVersions(t *testing.T, bin string) []string {
	out := testutil.Run(t, bin, testutil.Call{Command: "VERSION", Stdin: []byte(`{"cniVersion":"0.4.0"}`)}).Must(t)
	var v struct {
		Supported []string `json:"supportedVersions"`
	}
	require.NoError(t, json.Unmarshal(out.Stdout, &v))
	return v.Supported
}
