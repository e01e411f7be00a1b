package datapath

import (
	"fmt"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

// testPrograms loads the programs into a private bpffs.
func testPrograms(t testing.TB) (bpfRoot, stateDir string, p *Programs) {
	t.Helper()
	bpfRoot = testutil.BPFFS(t)
	stateDir = t.TempDir()
	p, loaded, err := EnsurePrograms(bpfRoot, stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if !loaded {
		t.Fatal("first EnsurePrograms did not load")
	}
	t.Cleanup(p.Close)
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
