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
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/pkg/portmap"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

// The features in the order ADD sets them up around the endpoint (the
// core's step that writes the pod's entries in the endpoint maps and
// attaches its host veth's programs, pkg/endpoint); DEL takes them down in
// reverse. The order is what the datapath needs: masquerade's settings and
// the pod's buckets exist before the endpoint entries whose flags make the
// programs use them, and the pod's first NetworkPolicy state before those
// entries make it reachable (Before); ports are published once the
// endpoint exists, and unpublished before its entries go at DEL (After);
// the pod's flows are flushed once its entries are gone.
var (
	// Before are set up before the endpoint, taken down after it.
	Before = []feature.Feature{
		nat.Feature{},       // masquerade (ipMasq)
		cluster.Feature{},   // the cluster's pod ranges and the VXLAN overlay (clusterCIDRs, overlay)
		flows.Feature{},     // Services through netfilter (kube-proxy): the flow table
		bandwidth.Feature{}, // rate limits and source pacing
		policy.Feature{},    // NetworkPolicy: the pod's first state (closed where its namespace's policies isolate it)
	}
	// After are set up once the endpoint exists, taken down before it.
	After = []feature.Feature{
		portmap.Feature{}, // hostPort (portMappings)
	}
	// All are Before and After: the order of ADD.
	All = append(append([]feature.Feature{}, Before...), After...)
)

// Objects are every program object the node runs: the endpoint's and the
// features', in ADD order, each once (two features may share one, as
// masquerade and hostPort share the uplinks').
func Objects() []programs.Object {
	var out []programs.Object
	seen := map[string]bool{}
	add := func(objs []programs.Object) {
		for _, o := range objs {
			if !seen[o.Name] {
				seen[o.Name] = true
				out = append(out, o)
			}
		}
	}
	for _, f := range Before {
		add(f.Programs())
	}
	add(endpoint.Objects())
	for _, f := range After {
		add(f.Programs())
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

// Columns are what the features show of every endpoint in the CLI's
// endpoints command, in ADD order.
func Columns() []*view.Columns {
	var out []*view.Columns
	for _, f := range All {
		if c := f.Columns(); c != nil {
			out = append(out, c)
		}
	}
	return out
}
