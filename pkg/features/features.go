// Package features registers the features of ebpf-cni: the one place that
// names them. The verbs (pkg/plugin) and the operator CLI (pkg/cli) use
// them through this list only.
package features

import (
	"github.com/ebpf-cni/ebpf-cni/pkg/bandwidth"
	"github.com/ebpf-cni/ebpf-cni/pkg/cluster"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/flows"
	"github.com/ebpf-cni/ebpf-cni/pkg/nat"
	"github.com/ebpf-cni/ebpf-cni/pkg/portmap"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

// All are the features in the order ADD sets them up; DEL takes them down
// in reverse. The order is what the datapath needs: masquerade's settings
// and the pod's buckets exist before the endpoint entries whose flags make
// the programs use them; published ports go before the endpoint's entries
// at DEL; the pod's flows are flushed once its entries are gone.
var All = []feature.Feature{
	nat.Feature{},       // masquerade (ipMasq)
	cluster.Feature{},   // the cluster's pod ranges and the VXLAN overlay (clusterCIDRs, overlay)
	flows.Feature{},     // Services through netfilter (kube-proxy): the flow table
	bandwidth.Feature{}, // rate limits and source pacing
	endpoint.Feature{},  // the endpoint maps and the host veth's programs
	portmap.Feature{},   // hostPort (portMappings)
}

// Objects are every program object the features need, each once (two
// features may share one, as masquerade and hostPort share the uplinks').
func Objects() []programs.Object {
	var out []programs.Object
	seen := map[string]bool{}
	for _, f := range All {
		for _, o := range f.Programs() {
			if !seen[o.Name] {
				seen[o.Name] = true
				out = append(out, o)
			}
		}
	}
	return out
}

// Tag is this build's program tag, programs.Tag(Objects()) from the digest
// make generate wrote: no call reads the 640 KB of objects to know it.
func Tag() string { return programs.TagOf(objectsDigest) }

// Commands are the features' operator CLI commands.
func Commands() []*view.Command {
	var out []*view.Command
	for _, f := range All {
		out = append(out, f.Commands()...)
	}
	return out
}
