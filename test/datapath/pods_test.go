package datapath_test

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
)

// TestThreePods is the must-hold case, under every spec version and both
// attach modes: three pods ping and talk TCP to each other over IPv4 and
// IPv6, without a bridge, without netfilter rules, without the node's
// FORWARD path, with one shared program; CHECK passes; DEL (twice, once
// without netns) leaves nothing.
func TestThreePods(t *testing.T) {
	for _, v := range testutil.SpecVersions {
		for _, mode := range testutil.AttachModes {
			t.Run(v+"/"+mode, func(t *testing.T) {
				testutil.RequireMode(t, mode)
				testThreePods(t, v, mode)
			})
		}
	}
}

var forwardPkts = regexp.MustCompile(`(?m)^\s*(\d+)\s+\d+\s.*10\.244\.1\.0/24\s+10\.244\.1\.0/24`)

func testThreePods(t *testing.T, version, mode string) {
	e := newEnv(t)
	list := e.confList(netOpts{version: version, attachMode: mode})
	rulesBefore := e.ruleset()
	// The node's own programs: the kernel's count of every program loaded
	// moves with whatever else runs on the machine (other nodes' programs
	// freed lazily, tests run beside this one).
	pinned := func() ebpf.ProgramID {
		tags, err := programs.Installed(e.bpfRoot)
		require.NoError(t, err)
		require.Len(t, tags, 1, "one build's programs pinned")
		p, err := ebpf.LoadPinnedProgram(filepath.Join(programs.Dir(e.bpfRoot), tags[0], endpoint.HooksFor(testutil.PodDevice())[0].Name), nil)
		require.NoError(t, err)
		defer p.Close()
		info, err := p.Info()
		require.NoError(t, err)
		id, _ := info.ID()
		return id
	}

	var pods []*nettest.Pod
	var first ebpf.ProgramID
	for i, id := range ids("pod", 3) {
		pods = append(pods, e.addPod(list, id))
		if i == 0 {
			first = pinned()
		}
	}
	require.Equal(t, first, pinned(), "later ADDs load no program")
	attached := e.attachedProgramIDs()
	require.Contains(t, attached, first, "the endpoints run the pinned program")
	require.Len(t, attached, 1, "all endpoints run one program")
	for _, n := range attached {
		require.Equal(t, 3, n)
	}

	for _, p := range pods {
		require.NotNil(t, p.IP(4))
		require.NotNil(t, p.IP(6))
		if testutil.AtLeast(version, "0.3.0") {
			require.Len(t, p.Result.Interfaces, 2)
			require.Equal(t, p.NS.Path(), p.Result.Interfaces[1].Sandbox)
			require.Empty(t, p.Result.Interfaces[0].Sandbox)
			for _, ipc := range p.Result.IPs {
				require.NotNil(t, ipc.Interface)
				require.Equal(t, 1, *ipc.Interface)
			}
		}
	}

	// No bridge, and the plugin added no rule at all.
	for name, kind := range e.linkKinds() {
		require.NotEqual(t, "bridge", kind, "bridge device %s", name)
	}
	require.Equal(t, rulesBefore, e.ruleset(), "the plugin changed the node's ruleset")

	// A counting rule in FORWARD sees no pod-to-pod packet.
	_, err := nettest.Run(e.node.NS, "iptables", "-I", "FORWARD", "-s", "10.244.1.0/24", "-d", "10.244.1.0/24")
	require.NoError(t, err)
	_, err = nettest.Run(e.node.NS, "ip6tables", "-I", "FORWARD", "-s", "fd00:244:1::/64", "-d", "fd00:244:1::/64")
	require.NoError(t, err)
	before := e.counters()

	mustConnect(t, pods)

	out, err := nettest.Run(e.node.NS, "iptables", "-L", "FORWARD", "-v", "-x", "-n")
	require.NoError(t, err)
	m := forwardPkts.FindStringSubmatch(out)
	require.NotNil(t, m, "counting rule not found in:\n%s", out)
	require.Equal(t, "0", m[1], "pod-to-pod packets went through FORWARD:\n%s", out)
	out6, err := nettest.Run(e.node.NS, "ip6tables", "-L", "FORWARD", "-v", "-x", "-n")
	require.NoError(t, err)
	m6 := regexp.MustCompile(`(?m)^\s*(\d+)\s+\d+\s.*fd00:244:1::/64`).FindStringSubmatch(out6)
	require.NotNil(t, m6, "counting rule not found in:\n%s", out6)
	require.Equal(t, "0", m6[1], "pod-to-pod IPv6 packets went through FORWARD:\n%s", out6)
	after := e.counters()
	require.Greater(t, after[1], before[1], "no packet took the redirect_peer path")

	// Pod to node and node to pod.
	for _, p := range pods {
		o, err := nettest.Ping(p.NS, nettest.NodeIP4, 1)
		require.NoError(t, err, o)
		o, err = nettest.Ping(p.NS, nettest.NodeIP6, 1)
		require.NoError(t, err, o)
		o, err = nettest.Ping(e.node.NS, p.IP(4), 1)
		require.NoError(t, err, o)
		o, err = nettest.Ping(e.node.NS, p.IP(6), 1)
		require.NoError(t, err, o)
		require.NoError(t, nettest.TCP(e.node.NS, p.NS, p.IP(4)))
		require.NoError(t, nettest.TCP(p.NS, e.node.NS, nettest.NodeIP4))
	}

	if testutil.AtLeast(version, "0.4.0") {
		for _, p := range pods {
			require.NoError(t, e.cni.Check(list, p.RT), "CHECK right after ADD")
		}
	}
	if testutil.AtLeast(version, "1.1.0") {
		require.NoError(t, e.cni.Status(list))
	}

	// DEL: twice each; the last pod once more without its netns.
	for i, p := range pods {
		require.NoError(t, e.cni.Del(list, p.RT))
		require.NoError(t, e.cni.Del(list, p.RT))
		if i == len(pods)-1 {
			rt := *p.RT
			rt.NetNS = ""
			require.NoError(t, e.cni.Del(list, &rt))
		}
	}
	e.requireClean()
	_ = strconv.Itoa
	_ = fmt.Sprint
	_ = ns.GetCurrentNS
	_ = netlink.LinkList
}
