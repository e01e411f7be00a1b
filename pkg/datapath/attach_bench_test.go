package datapath

import (
	"fmt"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

// BenchmarkAttach measures what one ADD pays to attach the program to a
// fresh host veth, per mode (device creation and cleanup excluded).
// Run: go test -run XXX -bench Attach -benchtime 200x ./pkg/datapath/
func BenchmarkAttach(b *testing.B) {
	for _, mode := range []Mode{ModeTCX, ModeTC} {
		b.Run(string(mode), func(b *testing.B) {
			bpfRoot, _, p := testPrograms(b)
			n := testutil.NetNS(b)
			prog := p.ByHook[HookFromContainer.Name]
			err := n.Do(func(ns.NetNS) error {
				// A node always has other endpoints attached: keep one, so the
				// kernel's ingress static keys stay enabled as in production.
				anchor := testVeth(b, n, "anchor")
				if _, err := Attach(mode, anchor, HookFromContainer, prog, LinkDir(bpfRoot, "anchor")); err != nil {
					return err
				}
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					l := testVeth(b, n, fmt.Sprintf("bench%d", i%1000))
					b.StartTimer()
					a, err := Attach(mode, l, HookFromContainer, prog, LinkDir(bpfRoot, l.Attrs().Name))
					b.StopTimer()
					if err != nil {
						return err
					}
					if err := Detach(a, l.Attrs().Index); err != nil {
						return err
					}
					if err := netlink.LinkDel(l); err != nil {
						return err
					}
					b.StartTimer()
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}
