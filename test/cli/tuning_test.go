package cli_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/conflisttest"
	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/cli"
	"github.com/ebpf-cni/ebpf-cni/pkg/kernel"
)

// TestChainedTuningMAC: a chained tuning plugin with a static mac changes
// the pod's MAC after ebpf-cni recorded it, so the datapath drops every
// packet of the pod as spoofed: endpoints shows the pod's MAC next to the
// enforced one, and CHECK and status report it. Given to ebpf-cni (the mac
// capability) the same MAC works.
func TestChainedTuningMAC(t *testing.T) {
	const mac = "0e:11:22:33:44:55"
	n := testutil.NewNode(t, true) // Debian's tuning
	e := &env{t: t, node: n.Node, cni: n.CNI, bpfRoot: n.BPFRoot, stateDir: n.StateDir, bin: filepath.Join(n.Paths[0], "ebpf-cni")}
	tuning := map[string]any{"type": "tuning", "mac": mac}
	if kernel.HaveNetkit().Available {
		// A netkit pod (L3 mode) has no MAC to set: tuning's ADD fails,
		// and the runtime's DEL of the failed attachment leaves nothing.
		nk := conflisttest.List(t, conflisttest.Options{Name: "clinet", Version: "1.0.0", BPFRoot: e.bpfRoot, StateDir: e.stateDir,
			Chained: []map[string]any{tuning}, Keys: map[string]any{"deviceType": "netkit"}})
		_, err := e.cni.AddPod(nk, "tuned-netkit", nil)
		require.ErrorContains(t, err, "tuning")
		require.NoError(t, e.cni.Del(nk, &libcni.RuntimeConf{ContainerID: "tuned-netkit", IfName: "eth0"}))
	}
	// Such a list makes veth pods (docs/configuration.md, deviceType).
	list := conflisttest.List(t, conflisttest.Options{Name: "clinet", Version: "1.0.0", BPFRoot: e.bpfRoot, StateDir: e.stateDir,
		Chained: []map[string]any{tuning}, Keys: map[string]any{"deviceType": "veth"}})
	p := e.addPod(list, "tuned")
	_, err := nettest.Ping(p.NS, nettest.NodeIP4, 1)
	require.Error(t, err, "the datapath drops what the pod sends from a MAC it did not give it")

	var eps []cli.Endpoint
	e.json(&eps, cli.ExitOK, "endpoints", "-o", "json")
	require.Len(t, eps, 1, "nothing left of the failed netkit attachment")
	require.Equal(t, mac, eps[0].PodMAC)
	require.NotEqual(t, mac, eps[0].MAC)
	require.NotEmpty(t, eps[0].Problems)
	require.Contains(t, strings.Join(eps[0].Problems, "\n"), "drop_spoof_mac")
	r := e.cli("status", "-o", "json")
	require.Equal(t, cli.ExitProblems, r.code, "%s", r)
	require.Contains(t, r.stdout, "tuning")
	require.Error(t, e.cni.Check(list, p.RT), "CHECK reports the MAC")
	require.NoError(t, e.cni.DelPod(list, p))

	// The MAC given to ebpf-cni: the pod works.
	own := conflisttest.List(t, conflisttest.Options{Name: "clinet", Version: "1.0.0", BPFRoot: e.bpfRoot, StateDir: e.stateDir,
		Capabilities: []string{"mac"}})
	q, err := e.cni.AddPod(own, "own-mac", map[string]any{"mac": mac})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.cni.DelPod(own, q) })
	out, err := nettest.Ping(q.NS, nettest.NodeIP4, 1)
	require.NoError(t, err, "%s", out)
	eps = nil // json.Unmarshal would keep the fields the new JSON omits
	e.json(&eps, cli.ExitOK, "endpoints", "-o", "json")
	require.Len(t, eps, 1)
	require.Equal(t, mac, eps[0].MAC)
	require.Empty(t, eps[0].PodMAC, "%+v", eps[0])
	require.Empty(t, eps[0].Problems)
}
