package cli_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/conflisttest"
	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/cli"
)

type leakGCJSON struct {
	DryRun    bool            `json:"dryRun"`
	IPAMLeaks []*cli.IPAMLeak `json:"ipamLeaks"`
	Skipped   []string        `json:"skipped"`
}

// TestIPAMLeaks is the Must-hold of issue 27 for leaks ebpf-ipam holds: an
// address ebpf-ipam handed out with no endpoint (a runtime that never
// called DEL) shows in status and gc --dry-run; gc releases it when the
// network namespace of its ADD is gone, or when its container is not among
// the live ones the operator names; a live pod is never touched.
func TestIPAMLeaks(t *testing.T) {
	e := newEnv(t)
	list := e.confList("")
	pod := e.addPod(list, "pod-live")
	podIPs := []string{pod.IP(4).String(), pod.IP(6).String()}

	// ebpf-ipam ADDs as another interface plugin (or a runtime that then
	// forgot the container) makes them, in the node, for two containers:
	// one whose netns is then deleted, one whose netns stays.
	ipamConf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"clinet","ipam":{"type":"ebpf-ipam","bpfRoot":%q,"stateDir":%q,"ranges":[[{"subnet":%q}],[{"subnet":%q}]]}}`,
		e.bpfRoot, e.stateDir, conflisttest.DefaultSubnets[0], conflisttest.DefaultSubnets[1])
	gone, err := nettest.NewNetNS()
	require.NoError(t, err)
	alive := testutil.NetNS(t)
	leak := func(id string, n ns.NetNS) []string {
		var out *testutil.Output
		require.NoError(t, e.node.NS.Do(func(ns.NetNS) error {
			out = testutil.Run(t, filepath.Join(filepath.Dir(e.bin), "ebpf-ipam"), testutil.Call{Command: "ADD", ContainerID: id,
				NetNS: n.Path(), IfName: "eth0", Path: filepath.Dir(e.bin), Stdin: []byte(ipamConf)})
			return nil
		}))
		out.Must(t)
		var res struct {
			IPs []struct{ Address string } `json:"ips"`
		}
		require.NoError(t, jsonUnmarshal(string(out.Stdout), &res))
		var ips []string
		for _, ip := range res.IPs {
			ips = append(ips, strings.Split(ip.Address, "/")[0])
		}
		require.Len(t, ips, 2)
		return ips
	}
	goneIPs := leak("leak-gone", gone)
	nettest.CloseNetNS(gone)
	aliveIPs := leak("leak-alive", alive)
	requireHeld(t, e, append(append(append([]string{}, podIPs...), goneIPs...), aliveIPs...), true)

	// status: the one whose netns is gone is a problem, the other a note.
	var st cli.Status
	e.json(&st, cli.ExitProblems, "status")
	require.Len(t, st.Problems, 1, "%v", st.Problems)
	require.Contains(t, st.Problems[0], "leak-gone/eth0")
	require.Contains(t, st.Problems[0], goneIPs[0])
	require.Contains(t, st.Problems[0], "gone")
	require.Contains(t, strings.Join(st.Notes, "\n"), "leak-alive/eth0")

	// gc --dry-run lists it and releases nothing; gc releases it.
	var g leakGCJSON
	e.json(&g, cli.ExitOK, "gc", "--dry-run")
	require.Len(t, g.IPAMLeaks, 1)
	require.Equal(t, "leak-gone", g.IPAMLeaks[0].ContainerID)
	require.Equal(t, "clinet", g.IPAMLeaks[0].Network)
	require.ElementsMatch(t, goneIPs, g.IPAMLeaks[0].IPs)
	require.Empty(t, g.IPAMLeaks[0].Released)
	require.Contains(t, strings.Join(g.Skipped, "\n"), "leak-alive/eth0")
	requireHeld(t, e, goneIPs, true)
	g = leakGCJSON{}
	e.json(&g, cli.ExitOK, "gc")
	require.Len(t, g.IPAMLeaks, 1)
	require.ElementsMatch(t, goneIPs, g.IPAMLeaks[0].Released)
	requireHeld(t, e, goneIPs, false)
	requireHeld(t, e, append(append([]string{}, podIPs...), aliveIPs...), true)

	// Naming the live containers: leak-alive is not among them.
	g = leakGCJSON{}
	e.json(&g, cli.ExitOK, "gc", "--dry-run", "--live-containers", "pod-live,other")
	require.Len(t, g.IPAMLeaks, 1)
	require.Equal(t, "leak-alive", g.IPAMLeaks[0].ContainerID)
	require.Contains(t, g.IPAMLeaks[0].Gone, "--live-containers")
	requireHeld(t, e, aliveIPs, true)
	g = leakGCJSON{}
	e.json(&g, cli.ExitOK, "gc", "--live-containers", "pod-live other")
	require.ElementsMatch(t, aliveIPs, g.IPAMLeaks[0].Released)
	requireHeld(t, e, aliveIPs, false)
	requireHeld(t, e, podIPs, true)

	st = cli.Status{}
	e.json(&st, cli.ExitOK, "status")
	require.Empty(t, st.Problems)
	_, err = nettest.Ping(e.node.NS, pod.IP(4), 1)
	require.NoError(t, err, "the live pod keeps its traffic")
}
