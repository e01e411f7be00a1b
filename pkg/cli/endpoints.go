package cli

import (
	"flag"
	"fmt"
	"strings"

	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

func init() {
	register(&Command{
		Name:    "endpoints",
		Summary: "pods attached on this node: container, interfaces, IPs, MAC, programs and attach mode",
		Help: `One row per attachment (container ID/ifname): the pod (namespace/name, when
the runtime passed K8S_POD_NAMESPACE and K8S_POD_NAME in CNI_ARGS), the host veth and its ifindex,
the pod's addresses and MAC as the datapath enforces them (endpoint_devs),
the programs attached to the host veth (kernel program ID) and how (tcx or
tc), OTHER QDISCS: another plugin's qdiscs on the host veth (a chained
bandwidth plugin's "root tbf" and "ingress"; "(delivering)" when the
datapath has learned the root qdisc and delivers to the pod through it),
POLICY: the NetworkPolicy state of ingress and egress (open: no policy
selects the pod; closed: isolated, waiting for the node agent to write its
rules; enforced: only what its policies allow, see ebpf-cni policy),
POLICY DROPS: the packets denied each way,
and STATE: ok, or "problem" with each problem listed under the table.
Endpoints come from the records under --state-dir joined with the pinned
endpoint maps, so an entry either side lacks is shown too.

JSON: a list of objects with containerID, ifname, pod (namespace, name,
uid; absent without K8S_POD_*), network, netns, hostVeth,
hostIfindex, ips, mac, hostMAC, attachments (hook, mode, recordedMode,
programIDs, programTag), recorded, inMaps, vethPresent, problems, qdiscs,
viaQdisc, policy (ingress, egress: state open|closed|enforced, generation,
drops).`,
		Flags: func(*flag.FlagSet) func(*Context) error { return runEndpoints },
	})
}

func runEndpoints(ctx *Context) error {
	n, err := loadNode(ctx)
	if err != nil {
		return err
	}
	pv, closePolicy, err := readPolicy(ctx)
	if err != nil {
		return err
	}
	defer closePolicy()
	for _, e := range n.Endpoints {
		if e.Policy, err = pv.endpointPolicy(uint32(e.HostIfIndex)); err != nil {
			return err
		}
	}
	if ctx.JSON {
		return writeJSON(ctx.Stdout, n.Endpoints)
	}
	t := &view.Table{Header: []string{"CONTAINER/IFNAME", "POD", "HOST VETH", "IFINDEX", "IPS", "MAC", "PROGRAMS", "OTHER QDISCS", "POLICY", "POLICY DROPS", "STATE"},
		Right: map[int]bool{3: true}}
	var problems []string
	for _, e := range n.Endpoints {
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
		state := "ok"
		if len(e.Problems) > 0 {
			state = "problem"
			for _, p := range e.Problems {
				problems = append(problems, fmt.Sprintf("  %s (%s): %s", e.Name(), orDash(e.HostVeth), p))
			}
		}
		qdiscs := strings.Join(e.Qdiscs, ", ")
		if e.ViaQdisc {
			qdiscs += " (delivering)"
		}
		pod := ""
		if e.Pod != nil {
			pod = e.Pod.String()
		}
		t.Row(e.Name(), orDash(pod), orDash(e.HostVeth), fmt.Sprint(e.HostIfIndex), orDash(strings.Join(e.IPs, ",")), orDash(e.MAC), strings.Join(progs, "; "), orDash(qdiscs),
			"in:"+e.Policy.Ingress.State+" eg:"+e.Policy.Egress.State,
			"in:"+view.HumanCount(e.Policy.Ingress.Drops)+" eg:"+view.HumanCount(e.Policy.Egress.Drops), state)
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
