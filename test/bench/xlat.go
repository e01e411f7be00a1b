package main

import (
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"time"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
	nodestate "github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// benchServiceCIDR is the Service range the bench's nodes have: the
// manifest's serviceCIDRs, around kubeProxyServices' ClusterIPs.
var benchServiceCIDR = netip.MustParsePrefix("10.96.0.0/12")

// xlatLease: the bench has no node agent to renew the lease every 10 s, so
// it writes one that outlasts any run. The renewals cost the agent nothing
// per connection, and the programs read the lease the same way.
const xlatLease = 24 * time.Hour

// leaseTranslated makes an EBPF setup's node what the DaemonSet's agent
// makes it (translatedDestinations on, its default): the destinations
// kube-proxy translates there, from k's Services (nil: a node without
// Services, the masquerade path's) and the node's addresses, with the
// Service range, written and leased through the agent's own code
// (agent.XlatSet, XlatController.Sync). Off with -translated-destinations=false.
func (b *bench) leaseTranslated(s *setup, k *nettest.KubeProxy) error {
	if b.cfg.noXlat {
		return nil
	}
	if k == nil {
		k = &nettest.KubeProxy{}
	}
	k.NodeIPs = append(k.NodeIPs[:len(k.NodeIPs):len(k.NodeIPs)], nettest.NodeIP4, nettest.NodeIP6)
	svcs, nodes := k.APIObjects("bench")
	nd, err := nodestate.Open(nodestate.Options{BPFRoot: s.bpfRoot, StateDir: s.stateDir, Objects: features.Objects(), Tag: features.Tag(), Lock: nodestate.Unlocked})
	if err != nil {
		return fmt.Errorf("%s: the translated destinations: %w", s.name, err)
	}
	defer nd.Close()
	xc := agent.NewXlatController(nil, agent.XlatConfig{Node: nd, Lease: xlatLease, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := xc.Sync(agent.XlatSet(svcs, nodes, []netip.Prefix{benchServiceCIDR})); err != nil {
		return fmt.Errorf("%s: the translated destinations: %w", s.name, err)
	}
	return nil
}
