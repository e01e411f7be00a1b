package programs_test

import (
	"fmt"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// BenchmarkAttach measures what one ADD pays to attach the program to a
// fresh host veth, per mode (device creation and cleanup excluded).
// Run: go test -run XXX -bench Attach -benchtime 200x ./pkg/programs/
func BenchmarkAttach(b *testing.B) {
	for _, mode := range []attach.Mode{attach.ModeTCX, attach.ModeTC} {
		b.Run(string(mode), func(b *testing.B) {
			bpfRoot, _, p := testPrograms(b)
			n := testutil.NetNS(b)
			prog := mustProg(b, p, endpoint.HookFromContainer.Name)
			err := n.Do(func(ns.NetNS) error {
				// A node always has other endpoints attached: keep one, so the
				// kernel's ingress static keys stay enabled as in production.
				anchor := testVeth(b, n, "anchor")
				if _, err := attach.Attach(mode, anchor, endpoint.HookFromContainer, prog, node.LinkDir(bpfRoot, "anchor")); err != nil {
					return err
				}
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					l := testVeth(b, n, fmt.Sprintf("bench%d", i%1000))
					b.StartTimer()
					a, err := attach.Attach(mode, l, endpoint.HookFromContainer, prog, node.LinkDir(bpfRoot, l.Attrs().Name))
					b.StopTimer()
					if err != nil {
						return err
					}
					if err := attach.Detach(a, l.Attrs().Index, endpoint.HookFromContainer); err != nil {
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
