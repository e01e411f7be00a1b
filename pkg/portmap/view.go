package portmap

import (
	"flag"
	"fmt"
	"net"
	"strconv"

	"github.com/ebpf-cni/ebpf-cni/pkg/conntrack"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

// command is the operator CLI's ports command.
var command = &view.Command{
	Name:    "ports",
	Summary: "published hostPorts: where each leads, who holds it, live flows",
	Help: `Every published port in the pinned hostports map: protocol, the host
address it answers on ("*": every node address and localhost), the hostPort,
the pod address and containerPort it leads to, the pod's container ID and
interface, and how many live translated flows it has (hostPort entries of
the conntrack/NAT table).

JSON: a list of {"protocol", "hostIP", "hostPort", "podIP", "containerPort",
"containerID", "ifname", "flows"}, ordered by hostPort, protocol and host IP.`,
	Flags: func(fs *flag.FlagSet) func(*view.Context) error {
		return func(ctx *view.Context) error { return runPorts(ctx) }
	},
}

// Port is one published port as the CLI shows it.
type Port struct {
	Published
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
	Flows       int    `json:"flows"`
}

func readPorts(ctx *view.Context) ([]*Port, error) {
	if err := ctx.CheckRoot(); err != nil {
		return nil, err
	}
	ms, closeMaps, err := ctx.OpenMaps(maps.CniMapHostports, maps.CniMapEndpoints, maps.CniMapEndpointDevs, maps.CniMapNat, maps.CniMapNatTimeouts)
	if err != nil {
		return nil, err
	}
	defer closeMaps()
	out := []*Port{}
	if ms[maps.CniMapHostports] == nil {
		return out, nil
	}
	pub, err := List(ms[maps.CniMapHostports])
	if err != nil {
		return nil, err
	}
	flows := map[string]int{} // pod ip:port -> live hostPort flows
	if ms[maps.CniMapNat] != nil {
		if flows, err = conntrack.NewTable(ms[maps.CniMapNat], ms[maps.CniMapNatTimeouts]).LiveDNAT(); err != nil {
			return nil, err
		}
	}
	for _, p := range pub {
		row := &Port{Published: p, Flows: flows[net.JoinHostPort(p.PodIP, strconv.Itoa(int(p.ContainerPort)))]}
		if d, ok := maps.EndpointOf(ms[maps.CniMapEndpoints], ms[maps.CniMapEndpointDevs], net.ParseIP(p.PodIP)); ok {
			row.ContainerID, row.IfName = maps.GoString(d.ContainerId[:]), maps.GoString(d.Ifname[:])
		}
		out = append(out, row)
	}
	return out, nil
}

func runPorts(ctx *view.Context) error {
	ports, err := readPorts(ctx)
	if err != nil {
		return err
	}
	if ctx.JSON {
		return view.WriteJSON(ctx.Stdout, ports)
	}
	if len(ports) == 0 {
		fmt.Fprintln(ctx.Stdout, "no published ports")
		return nil
	}
	t := &view.Table{Header: []string{"PROTO", "HOST", "POD", "CONTAINER", "IFNAME", "FLOWS"}, Right: map[int]bool{5: true}}
	for _, p := range ports {
		host := net.JoinHostPort(p.HostIP, strconv.Itoa(int(p.HostPort)))
		cid := p.ContainerID
		if cid == "" {
			cid = "(no endpoint: GC removes it)"
		}
		t.Row(p.Proto, host, net.JoinHostPort(p.PodIP, strconv.Itoa(int(p.ContainerPort))), cid, p.IfName, strconv.Itoa(p.Flows))
	}
	if err := t.Write(ctx.Stdout); err != nil {
		return err
	}
	fmt.Fprintf(ctx.Stdout, "\n%d published port(s)\n", len(ports))
	return nil
}
