package cluster

import (
	"flag"
	"fmt"
	"net"
	"strings"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

// command is the operator CLI's cluster command.
var command = &view.Command{
	Name:    "tunnels",
	Summary: "VXLAN overlay endpoints (other nodes' pod ranges): list, add, delete",
	Help: `The overlay's tunnel endpoints: each other node's pod range and that node's
underlay address, in the pinned LPM map cluster_routes. Pods reach a pod in
such a range through the node's VXLAN device (overlay: vxlan). The node
agent keeps them in step with the cluster's Node objects; this command is
for nodes without the agent and for repairs.

  ebpf-cni tunnels                                   list
  ebpf-cni tunnels --add 10.244.2.0/24=192.0.2.12    add or change one (repeatable)
  ebpf-cni tunnels --del 10.244.2.0/24               delete one (repeatable)

With --add or --del it changes the map (creating it if no pod ran yet: the
programs find it pinned), then lists. Run it in the node's network
namespace with the plugin's --bpf-root and --state-dir.

JSON: a list of {"podCIDR", "node"}, ordered by pod range.`,
	Flags: func(fs *flag.FlagSet) func(*view.Context) error {
		var adds []Tunnel
		var dels []*net.IPNet
		fs.Func("add", "`POD_CIDR=NODE_IP`: reach POD_CIDR through the overlay at NODE_IP", func(v string) error {
			cidr, node, ok := strings.Cut(v, "=")
			_, n, err := net.ParseCIDR(cidr)
			ip := net.ParseIP(node)
			if !ok || err != nil || ip == nil {
				return fmt.Errorf("%q is not POD_CIDR=NODE_IP", v)
			}
			adds = append(adds, Tunnel{PodCIDR: n, Node: ip})
			return nil
		})
		fs.Func("del", "`POD_CIDR`: remove the endpoint of that pod range", func(v string) error {
			_, n, err := net.ParseCIDR(v)
			if err != nil {
				return fmt.Errorf("%q is not a CIDR", v)
			}
			dels = append(dels, n)
			return nil
		})
		return func(ctx *view.Context) error { return runTunnels(ctx, adds, dels) }
	},
}

// TunnelEntry is one endpoint as the CLI shows it.
type TunnelEntry struct {
	PodCIDR string `json:"podCIDR"`
	Node    string `json:"node"`
}

func runTunnels(ctx *view.Context, adds []Tunnel, dels []*net.IPNet) error {
	var list []Tunnel
	if len(adds)+len(dels) > 0 {
		if err := ctx.Node.CheckBPFFS(); err != nil {
			return err
		}
		// Written through the CLI's handle: no node lock (the plugin's
		// calls hold it), the cluster lock as every writer of the map.
		ts, err := OpenTunnels(ctx.Node)
		if err != nil {
			return err
		}
		defer ts.Close()
		for _, t := range adds {
			if err := ts.Add(t.PodCIDR, t.Node); err != nil {
				return err
			}
		}
		for _, n := range dels {
			if err := ts.Del(n); err != nil {
				return err
			}
		}
		if list, err = ts.List(); err != nil {
			return err
		}
	} else {
		if err := ctx.CheckRoot(); err != nil {
			return err
		}
		ms, closeMaps, err := ctx.OpenMaps(maps.CniMapClusterRoutes)
		if err != nil {
			return err
		}
		defer closeMaps()
		if m := ms[maps.CniMapClusterRoutes]; m != nil {
			if list, err = ListTunnels(m); err != nil {
				return err
			}
		}
	}
	out := []TunnelEntry{}
	for _, t := range list {
		out = append(out, TunnelEntry{PodCIDR: t.PodCIDR.String(), Node: t.Node.String()})
	}
	if ctx.JSON {
		return view.WriteJSON(ctx.Stdout, out)
	}
	if len(out) == 0 {
		fmt.Fprintln(ctx.Stdout, "no tunnel endpoints")
		return nil
	}
	t := &view.Table{Header: []string{"POD RANGE", "NODE"}}
	for _, e := range out {
		t.Row(e.PodCIDR, e.Node)
	}
	return t.Write(ctx.Stdout)
}
