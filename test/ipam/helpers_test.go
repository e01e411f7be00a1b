// Package ipam_test drives the ebpf-ipam binary as a runtime would, against a
// private bpffs and state directory per test.
package ipam_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/ipam"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// env is one isolated ebpf-ipam installation on a simulated node, where
// the plugin runs as a runtime runs it: the node's addresses (its uplink's
// 192.0.2.2/24 and 2001:db8:ffff::2/64) are the test's, not the machine's.
type env struct {
	t        *testing.T
	bin      string
	bpfRoot  string
	stateDir string
	network  string
	node     *nettest.Node
}

func newEnv(t *testing.T) *env {
	t.Helper()
	bpfRoot := testutil.BPFFS(t)
	node, err := nettest.NewNode()
	require.NoError(t, err)
	t.Cleanup(node.Close)
	return &env{
		t:        t,
		bin:      filepath.Join(testutil.PluginDir(t), "ebpf-ipam"),
		bpfRoot:  bpfRoot,
		stateDir: filepath.Join(t.TempDir(), "state"),
		network:  "testnet",
		node:     node,
	}
}

// in runs f in the node's network namespace.
func (e *env) in(f func()) {
	require.NoError(e.t, e.node.NS.Do(func(ns.NetNS) error { f(); return nil }))
}

// conf builds a network configuration whose ipam section holds extra keys.
func (e *env) conf(version, ipamKeys string, top ...string) []byte {
	s := fmt.Sprintf(`{"cniVersion":%q,"name":%q,"type":"ebpf-cni",`, version, e.network)
	for _, kv := range top {
		s += kv + ","
	}
	s += fmt.Sprintf(`"ipam":{"type":"ebpf-ipam","bpfRoot":%q,"stateDir":%q`, e.bpfRoot, e.stateDir)
	if ipamKeys != "" {
		s += "," + ipamKeys
	}
	return []byte(s + "}}")
}

func (e *env) run(cmd, id string, stdin []byte, args string) *testutil.Output {
	e.t.Helper()
	var out *testutil.Output
	e.in(func() {
		out = testutil.Run(e.t, e.bin, testutil.Call{Command: cmd, ContainerID: id, NetNS: "/var/run/netns/none", IfName: "eth0", Args: args, Path: "/nonexistent", Stdin: stdin})
	})
	return out
}

// add runs ADD and returns the result converted to the current version.
func (e *env) add(id string, stdin []byte, args string) *current.Result {
	e.t.Helper()
	out := e.run("ADD", id, stdin, args).Must(e.t)
	var v struct {
		CNIVersion string `json:"cniVersion"`
	}
	require.NoError(e.t, json.Unmarshal(out.Stdout, &v))
	res, err := current.NewResultFromResult(mustParse(e.t, v.CNIVersion, out.Stdout))
	require.NoError(e.t, err)
	return res
}

// held lists the addresses of the test network in the pinned allocation map
// (read without the plugin's help) and the attachment records on disk.
func (e *env) held() (addrs []string, records []string) {
	e.t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(maps.Dir(e.bpfRoot), maps.CniMapIpamAllocs), nil)
	if err == nil {
		defer m.Close()
		var k maps.CniIpamKey
		var v maps.CniIpamOwner
		it := m.Iterate()
		for it.Next(&k, &v) {
			if k.NetId != ipam.NetID(e.network) {
				continue
			}
			ip := net.IP(k.Addr[:])
			if k.Family == 4 {
				ip = net.IP(k.Addr[:4])
			}
			addrs = append(addrs, ip.String())
		}
		require.NoError(e.t, it.Err())
	} else if !errors.Is(err, os.ErrNotExist) {
		e.t.Fatalf("opening allocation map: %v", err)
	}
	ents, err := os.ReadDir(filepath.Join(e.stateDir, "ipam", e.network, "owners"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		e.t.Fatal(err)
	}
	for _, d := range ents {
		records = append(records, d.Name())
	}
	sort.Strings(addrs)
	return addrs, records
}

func (e *env) requireNothingHeld() {
	e.t.Helper()
	addrs, records := e.held()
	require.Empty(e.t, addrs, "allocation map entries left")
	require.Empty(e.t, records, "attachment records left")
}

func ipsOf(r *current.Result) []string {
	var out []string
	for _, ip := range r.IPs {
		out = append(out, ip.Address.IP.String())
	}
	return out
}

func replaceOnce(s, old, new string) string { return strings.Replace(s, old, new, 1) }

func asCurrent(t *testing.T, r types.Result) *current.Result {
	t.Helper()
	res, err := current.NewResultFromResult(r)
	require.NoError(t, err)
	return res
}
