package programs_test

import (
	"fmt"
	"github.com/cilium/ebpf"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
)

// testPrograms loads every registered feature's programs into a private
// bpffs.
func testPrograms(t testing.TB) (bpfRoot, stateDir string, p *programs.Set) {
	t.Helper()
	bpfRoot = testutil.BPFFS(t)
	stateDir = t.TempDir()
	n, err := node.Open(node.Options{BPFRoot: bpfRoot, StateDir: stateDir, Objects: features.Objects(), Lock: node.Unlocked})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	if p, err = n.Programs(); err != nil {
		t.Fatal(err)
	}
	if !n.Loaded() {
		t.Fatal("the first call did not load the programs")
	}
	return bpfRoot, stateDir, p
}

// testVeth creates a veth pair inside n and returns the first end.
func testVeth(t testing.TB, n ns.NetNS, name string) netlink.Link {
	t.Helper()
	var l netlink.Link
	err := n.Do(func(ns.NetNS) error {
		attrs := netlink.NewLinkAttrs()
		attrs.Name = name
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: name + "p"}); err != nil {
			return fmt.Errorf("adding veth %s: %w", name, err)
		}
		var err error
		l, err = netlink.LinkByName(name)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// mustProg is a program of the set, failing the test if it cannot be opened.
func mustProg(t testing.TB, s *programs.Set, name string) *ebpf.Program {
	t.Helper()
	p, err := s.Prog(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// openNode is a handle on the node under bpfRoot for the test's map
// writes (no lock), closed with the test.
func openNode(t testing.TB, bpfRoot string) *node.Node {
	t.Helper()
	n, err := node.Open(node.Options{BPFRoot: bpfRoot, Lock: node.Unlocked})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	return n
}
