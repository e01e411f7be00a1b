// Package datapath_test drives ebpf-cni through libcni in simulated nodes
// (network namespaces) with real packets.
package datapath_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/conflisttest"
	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/bandwidth"
	"github.com/ebpf-cni/ebpf-cni/pkg/counters"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// env is one simulated node with the plugins ready to run in it.
type env struct {
	t        testing.TB
	node     *nettest.Node
	cni      *nettest.CNI
	bpfRoot  string
	stateDir string
	cacheDir string
	paths    []string
	cgroup   string // the test's own cgroup, made on first use (bwList)
}

func newEnv(t *testing.T) *env { return newBenchEnv(t) }

// newBenchEnv is newEnv for tests and benchmarks alike.
func newBenchEnv(t testing.TB) *env {
	t.Helper()
	n := testutil.NewNode(t, true)
	return &env{t: t, node: n.Node, cni: n.CNI, bpfRoot: n.BPFRoot, stateDir: n.StateDir, cacheDir: n.CacheDir, paths: n.Paths}
}

// netOpts shape the network configuration.
type netOpts struct {
	name       string // default ebpfnet
	version    string
	attachMode string
	ipam       map[string]any // default: ebpf-ipam, dual-stack
	chained    []map[string]any
	extra      map[string]any // more keys of the ebpf-cni plugin config
}

func (e *env) confList(o netOpts) *libcni.NetworkConfigList {
	e.t.Helper()
	return conflisttest.List(e.t, conflisttest.Options{Name: o.name, Version: o.version, BPFRoot: e.bpfRoot, StateDir: e.stateDir,
		AttachMode: o.attachMode, IPAM: o.ipam, Capabilities: []string{"mac"}, Keys: o.extra, Chained: o.chained})
}

// addPod attaches a new pod and deletes it at cleanup.
func (e *env) addPod(list *libcni.NetworkConfigList, id string) *nettest.Pod {
	e.t.Helper()
	return testutil.AddPod(e.t, e.cni, list, id)
}

// hostLinks are ebpf-cni's host veths in the node.
func (e *env) hostLinks() []netlink.Link {
	e.t.Helper()
	var links []netlink.Link
	require.NoError(e.t, e.node.NS.Do(func(ns.NetNS) error {
		var err error
		links, err = veth.HostLinks()
		return err
	}))
	return links
}

// linkKinds lists the kinds of every link in the node (bridge must not be one).
func (e *env) linkKinds() map[string]string {
	e.t.Helper()
	out := map[string]string{}
	require.NoError(e.t, e.node.NS.Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		for _, l := range links {
			out[l.Attrs().Name] = l.Type()
		}
		return err
	}))
	return out
}

// pinnedLinks lists the files under bpfRoot/links and bpfRoot/uplinks.
func (e *env) pinnedLinks() []string {
	var out []string
	for _, dir := range []string{"links", "uplinks", "cgroup"} {
		_ = filepath.Walk(filepath.Join(e.bpfRoot, dir), func(p string, info os.FileInfo, err error) error {
			if err == nil && !info.IsDir() {
				out = append(out, p)
			}
			return nil
		})
	}
	return out
}

// endpointEntries counts entries of both endpoint maps.
func (e *env) endpointEntries() (addrs, devs int) {
	e.t.Helper()
	nd := e.handle()
	defer nd.Close()
	em, err := endpoint.MapsOf(nd)
	require.NoError(e.t, err)
	a, err := em.Addresses()
	require.NoError(e.t, err)
	d, err := em.Devices()
	require.NoError(e.t, err)
	return len(a), len(d)
}

// podEntries reads endpoint_pods: host ifindex -> the pod's identity.
func (e *env) podEntries() map[uint32]endpoint.Pod {
	e.t.Helper()
	nd := e.handle()
	defer nd.Close()
	em, err := endpoint.MapsOf(nd)
	require.NoError(e.t, err)
	pods, err := endpoint.ReadPods(em.Pods)
	require.NoError(e.t, err)
	return pods
}

// records counts endpoint records.
func (e *env) records() int {
	recs, err := node.Records(e.stateDir)
	require.NoError(e.t, err)
	return len(recs)
}

// requireClean asserts nothing of ebpf-cni is left in the node.
func (e *env) requireClean() {
	e.t.Helper()
	require.Empty(e.t, e.hostLinks(), "host veths left")
	require.Empty(e.t, e.pinnedLinks(), "pinned links left")
	a, d := e.endpointEntries()
	require.Zero(e.t, a, "endpoint address entries left")
	require.Zero(e.t, d, "endpoint device entries left")
	require.Empty(e.t, e.podEntries(), "endpoint_pods entries left")
	require.Zero(e.t, e.records(), "endpoint records left")
	ups, err := node.AttachmentSets(e.stateDir, "uplinks")
	require.NoError(e.t, err)
	require.Empty(e.t, ups, "uplink records left")
	require.Empty(e.t, e.netnsEntries(), "local_netns entries left")
	require.Empty(e.t, e.policyStates(), "policy_endpoints entries left")
}

// policyStates reads policy_endpoints: host ifindex -> NetworkPolicy state.
func (e *env) policyStates() map[uint32]policy.EndpointState {
	e.t.Helper()
	nd := e.handle()
	defer nd.Close()
	pm, err := policy.MapsOf(nd)
	require.NoError(e.t, err)
	st, err := pm.EndpointStates()
	require.NoError(e.t, err)
	return st
}

// netnsEntries lists local_netns: netns cookie -> host ifindex (0: node).
func (e *env) netnsEntries() map[uint64]int {
	e.t.Helper()
	nd := e.handle()
	defer nd.Close()
	n, err := bandwidth.NetnsOf(nd)
	require.NoError(e.t, err)
	m, err := n.Entries()
	require.NoError(e.t, err)
	return m
}

// attachedProgramIDs lists the distinct programs attached to host veths.
func (e *env) attachedProgramIDs() map[ebpf.ProgramID]int {
	e.t.Helper()
	ids := map[ebpf.ProgramID]int{}
	require.NoError(e.t, e.node.NS.Do(func(ns.NetNS) error {
		links, err := veth.HostLinks()
		if err != nil {
			return err
		}
		for _, l := range links {
			got, err := attach.AttachedIDs(l, endpoint.HooksOf(l)[0])
			if err != nil {
				return err
			}
			for _, id := range got {
				ids[id]++
			}
		}
		return nil
	}))
	return ids
}

// counters reads node_counters summed over CPUs and directions, by
// reason index.
func (e *env) counters() map[int]uint64 {
	e.t.Helper()
	by, err := counters.ReadCounters(e.bpfRoot)
	require.NoError(e.t, err)
	out := map[int]uint64{}
	for r, c := range by {
		out[int(r)] = c.Packets
	}
	return out
}

// iptablesRules dumps every rule of the node (iptables-nft and nft).
func (e *env) ruleset() string {
	e.t.Helper()
	out, err := nettest.Run(e.node.NS, "nft", "list", "ruleset")
	require.NoError(e.t, err)
	return out
}

// mustConnect pings and talks TCP between every pair of pods, both families.
func mustConnect(t *testing.T, pods []*nettest.Pod) {
	t.Helper()
	for i, a := range pods {
		for j, b := range pods {
			if i == j {
				continue
			}
			for _, fam := range []int{4, 6} {
				ip := b.IP(fam)
				if ip == nil {
					continue
				}
				out, err := nettest.Ping(a.NS, ip, 2)
				require.NoError(t, err, "ping pod%d -> pod%d %s: %s", i, j, ip, out)
				require.NoError(t, nettest.TCP(a.NS, b.NS, ip), "tcp pod%d -> pod%d %s", i, j, ip)
			}
		}
	}
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

var _ = net.IPv4len

// handle is a handle on the test's node as a call opens it, without the
// node lock (the test reads and writes maps beside the calls it makes);
// the caller closes it.
func (e *env) handle() *node.Node {
	e.t.Helper()
	n, err := node.Open(node.Options{BPFRoot: e.bpfRoot, StateDir: e.stateDir, Lock: node.Unlocked})
	require.NoError(e.t, err)
	return n
}
