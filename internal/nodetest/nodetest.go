// Package nodetest opens the node handle tests use beside the plugin's
// calls (a package of its own: pkg/node's own dependencies test with
// internal/testutil, which must not import it).
package nodetest

import (
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/features"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// Handle is a handle on the node under bpfRoot and stateDir as the node
// agent and the operator CLI have it (without the node lock), closed with
// the test.
func Handle(t testing.TB, bpfRoot, stateDir string) *node.Node {
	t.Helper()
	n, err := node.Open(node.Options{BPFRoot: bpfRoot, StateDir: stateDir, Objects: features.Objects(), Tag: features.Tag(), Lock: node.Unlocked})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	return n
}
