package cli

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"strings"

	"github.com/ebpf-cni/ebpf-cni/pkg/features"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

func init() {
	register(&Command{
		Name:    "endpoints",
		Summary: "pods attached on this node: container, interfaces, IPs, MAC, programs and attach mode",
		Help:    endpointsHelp(features.Columns()),
		Flags:   func(*flag.FlagSet) func(*Context) error { return runEndpoints },
	})
}

// endpointsHelp is the command's help with the columns of every feature
// that has some (view.Columns), between the core's and STATE.
func endpointsHelp(cols []*view.Columns) string {
	var table, js strings.Builder
	for _, c := range cols {
		table.WriteString(c.Help + "\n")
		js.WriteString(", " + c.JSONHelp)
	}
	return `One row per attachment (container ID/ifname): the pod (namespace/name, when
the runtime passed K8S_POD_NAMESPACE and K8S_POD_NAME in CNI_ARGS), the host veth and its ifindex,
the pod's addresses and MAC as the datapath enforces them (endpoint_devs),
the programs attached to the host veth (kernel program ID) and how (tcx or
tc), OTHER QDISCS: another plugin's qdiscs on the host veth (a chained
bandwidth plugin's "root tbf" and "ingress"; "(delivering)" when the
datapath has learned the root qdisc and delivers to the pod through it),
` + table.String() + `and STATE: ok, or "problem" with each problem listed under the table.
Endpoints come from the records under --state-dir joined with the pinned
endpoint maps, so an entry either side lacks is shown too.

JSON: a list of objects with containerID, ifname, pod (namespace, name,
uid; absent without K8S_POD_*), network, netns, hostVeth,
hostIfindex, ips, mac, hostMAC, attachments (hook, mode, recordedMode,
programIDs, programTag), recorded, inMaps, vethPresent, problems, qdiscs,
viaQdisc` + js.String() + "."
}

// endpointJSON is an endpoint as -o json writes it: its own fields, then
// each feature's (view.Columns.Key), in registration order.
type endpointJSON struct {
	*Endpoint
	features []featureField
}

type featureField struct {
	key   string
	value any
}

func (e endpointJSON) MarshalJSON() ([]byte, error) {
	out, err := encodeJSON(e.Endpoint)
	if err != nil {
		return nil, err
	}
	out = out[:len(out)-1] // its closing brace: the features' fields follow
	for _, f := range e.features {
		k, err := encodeJSON(f.key)
		if err != nil {
			return nil, err
		}
		v, err := encodeJSON(f.value)
		if err != nil {
			return nil, fmt.Errorf("encoding %s: %w", f.key, err)
		}
		out = append(append(append(append(out, ','), k...), ':'), v...)
	}
	return append(out, '}'), nil
}

// encodeJSON is v as view.WriteJSON writes it (no HTML escaping), on one
// line.
func encodeJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// featureCells are the features' columns of every endpoint of n: per
// feature (cols), one Cells per endpoint.
func featureCells(ctx *Context, n *snapshot, cols []*view.Columns) ([][]view.Cells, error) {
	refs := n.refs()
	out := make([][]view.Cells, len(cols))
	for i, c := range cols {
		cells, err := c.Read(ctx, refs)
		if err != nil {
			return nil, err
		}
		if len(cells) != len(refs) {
			return nil, fmt.Errorf("columns %s: %d rows for %d endpoints", c.Key, len(cells), len(refs))
		}
		out[i] = cells
	}
	return out, nil
}

func runEndpoints(ctx *Context) error {
	n, err := loadNode(ctx)
	if err != nil {
		return err
	}
	cols := features.Columns()
	cells, err := featureCells(ctx, n, cols)
	if err != nil {
		return err
	}
	if ctx.JSON {
		out := make([]endpointJSON, len(n.Endpoints))
		for i, e := range n.Endpoints {
			out[i].Endpoint = e
			for j, c := range cols {
				out[i].features = append(out[i].features, featureField{c.Key, cells[j][i].JSON})
			}
		}
		return writeJSON(ctx.Stdout, out)
	}
	header := []string{"CONTAINER/IFNAME", "POD", "HOST VETH", "IFINDEX", "IPS", "MAC", "PROGRAMS", "OTHER QDISCS"}
	for _, c := range cols {
		header = append(header, c.Header...)
	}
	t := &view.Table{Header: append(header, "STATE"), Right: map[int]bool{3: true}}
	var problems []string
	for i, e := range n.Endpoints {
		state := "ok"
		if len(e.Problems) > 0 {
			state = "problem"
			for _, p := range e.Problems {
				problems = append(problems, fmt.Sprintf("  %s (%s): %s", e.Name(), orDash(e.HostVeth), p))
			}
		}
		row := e.cells()
		for j := range cols {
			row = append(row, cells[j][i].Text...)
		}
		t.Row(append(row, state)...)
	}
	if t.Len() == 0 {
		fmt.Fprintln(ctx.Stdout, "no endpoints on this node")
		return nil
	}
	if err := t.Write(ctx.Stdout); err != nil {
		return err
	}
	if len(problems) > 0 {
		fmt.Fprintf(ctx.Stdout, "\nproblems:\n%s\n", strings.Join(problems, "\n"))
	}
	return nil
}

// cells are the core's columns of the endpoint's row.
func (e *Endpoint) cells() []string {
	var progs []string
	for _, a := range e.Attachments {
		ids := make([]string, len(a.ProgramIDs))
		for i, id := range a.ProgramIDs {
			ids[i] = fmt.Sprintf("#%d", id)
		}
		if len(ids) == 0 {
			ids = []string{"(none)"}
		}
		progs = append(progs, fmt.Sprintf("%s %s %s", a.Hook, orDash(a.Mode), strings.Join(ids, ",")))
	}
	qdiscs := strings.Join(e.Qdiscs, ", ")
	if e.ViaQdisc {
		qdiscs += " (delivering)"
	}
	pod := ""
	if e.Pod != nil {
		pod = e.Pod.String()
	}
	return []string{e.Name(), orDash(pod), orDash(e.HostVeth), fmt.Sprint(e.HostIfIndex), orDash(strings.Join(e.IPs, ",")), orDash(e.MAC),
		strings.Join(progs, "; "), orDash(qdiscs)}
}
