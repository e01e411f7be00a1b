package testutil

import (
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/ebpf-cni/ebpf-cni/internal/conflisttest"
	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
)

// Node is a simulated node (nettest.Node) with the plugins ready to run in
// it and a private bpffs and state directory: what every test package that
// drives the plugins through libcni starts from.
type Node struct {
	*nettest.Node
	CNI      *nettest.CNI
	BPFRoot  string
	StateDir string
	CacheDir string
	// Paths is CNI_PATH: the built plugins, then Debian's reference
	// plugins when asked for.
	Paths []string
}

// NewNode builds the node; withRef puts the reference plugins on CNI_PATH
// too. Everything goes at cleanup.
func NewNode(t testing.TB, withRef bool) *Node {
	t.Helper()
	RequireRoot(t)
	n := &Node{BPFRoot: BPFFS(t), StateDir: t.TempDir(), CacheDir: t.TempDir(), Paths: []string{PluginDir(t)}}
	if withRef {
		n.Paths = append(n.Paths, RefPluginDir(t))
	}
	node, err := nettest.NewNode()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(node.Close)
	n.Node = node
	n.CNI = nettest.NewCNI(node, n.Paths, n.CacheDir)
	return n
}

// List is the network o describes, with this node's bpfRoot and stateDir.
func (n *Node) List(t testing.TB, o conflisttest.Options) *libcni.NetworkConfigList {
	t.Helper()
	o.BPFRoot, o.StateDir = n.BPFRoot, n.StateDir
	return conflisttest.List(t, o)
}
