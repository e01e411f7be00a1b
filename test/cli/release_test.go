package cli_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/conflisttest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/cli"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// TestGCReleasesTheNode: when `ebpf-cni gc` removes a node's last endpoint
// it takes the node-wide attachments with it (the uplink's masquerade
// programs), as DEL and the CNI GC do: they share one teardown; and status
// flags node-wide attachments left with no endpoint.
func TestGCReleasesTheNode(t *testing.T) {
	n := testutil.NewNode(t, true) // a world: masquerade needs an uplink
	e := &env{t: t, node: n.Node, cni: n.CNI, bpfRoot: n.BPFRoot, stateDir: n.StateDir, bin: filepath.Join(n.Paths[0], "ebpf-cni")}
	list := conflisttest.List(t, conflisttest.Options{Name: "clinet", BPFRoot: e.bpfRoot, StateDir: e.stateDir, Keys: map[string]any{"ipMasq": true}})
	p, err := e.cni.AddPod(list, "last", nil)
	require.NoError(t, err)
	sets, err := node.AttachmentSets(e.stateDir, "")
	require.NoError(t, err)
	require.NotEmpty(t, sets, "masquerade attached the uplink's programs")
	saved := map[string][]byte{}
	for _, s := range sets {
		path := filepath.Join(e.stateDir, "attachments", s.Owner, s.Name+".json")
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		saved[path] = b
	}

	// The pod goes without a DEL; gc collects it and releases the node.
	e.killPod(p)
	var out gcJSON
	e.json(&out, cli.ExitOK, "gc")
	require.Len(t, out.Endpoints, 1)
	sets, err = node.AttachmentSets(e.stateDir, "")
	require.NoError(t, err)
	require.Empty(t, sets, "gc released the node-wide attachments with the last endpoint")
	require.NoError(t, e.node.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("uplink")
		require.NoError(t, err)
		filters, err := netlink.FilterList(l, netlink.HANDLE_MIN_EGRESS)
		require.NoError(t, err)
		require.Empty(t, filters, "no tc program on the uplink")
		return nil
	}))
	var st cli.Status
	e.json(&st, cli.ExitOK, "status")
	require.Empty(t, st.Problems)

	// A node-wide attachment with no endpoint (as gc before this change
	// left one): status says so.
	for path, b := range saved {
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o700))
		require.NoError(t, os.WriteFile(path, b, 0o600))
	}
	r := e.cli("status", "-o", "json")
	require.NotEqual(t, cli.ExitOK, r.code, "%s", r)
	require.Contains(t, r.stdout, "with no endpoint on the node")
	e.json(&out, cli.ExitOK, "gc")
	e.json(&st, cli.ExitOK, "status")
	require.Empty(t, st.Problems)
}
