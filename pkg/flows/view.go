package flows

import (
	"flag"
	"fmt"
	"net"
	"sort"
	"strconv"
	"time"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/conntrack"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

// command is the operator CLI's flows command.
var command = &view.Command{
	Name:    "flows",
	Summary: "flows the datapath tracks for netfilter (kube-proxy): fast path or through the stack",
	Help: `Every entry of the pinned flow table (flows): a pod's flow, as the pod sends
it, that netfilter may translate (to a destination outside the cluster's pod
ranges, or opened toward the pod), and its verdict: pending (through the
stack until netfilter is seen to let one of its packets through: the
clients of a Service without endpoints stay pending), fast (netfilter
leaves it alone: redirected both ways; a UDP flow whose conntrack entry
goes is pending again), stack (netfilter translated it, a Service, or the
stack delivered it: through the stack both ways). inbound: opened toward
the pod, its replies are never masqueraded. untracked: it left the node
without a conntrack entry (conntrack is not active in the node's network
namespace), conntrack is not asked again for a second. bypass: set up in
BPF without meeting netfilter (the node agent's set of destinations
netfilter may translate was current and did not hold the remote); the
table's last line says whether that set's lease runs. A TCP flow set up in
BPF and masqueraded keeps its verdict in its conntrack/NAT entry instead
(ebpf-cni nat): it is listed here too, from there (table "nat").

JSON: a list of {"proto", "pod", "podPort", "remote", "remotePort",
"verdict", "inbound", "untracked", "bypass", "idleSeconds", "table"},
ordered by pod, protocol and remote.`,
	Flags: func(fs *flag.FlagSet) func(*view.Context) error {
		pod := fs.String("pod", "", "show only the flows of the pod address `IP`")
		return func(ctx *view.Context) error { return runFlows(ctx, *pod) }
	},
}

// FlowEntry is one flow as the CLI shows it.
type FlowEntry struct {
	Proto       string  `json:"proto"`
	Pod         string  `json:"pod"`
	PodPort     uint16  `json:"podPort"`
	Remote      string  `json:"remote"`
	RemotePort  uint16  `json:"remotePort"`
	Verdict     string  `json:"verdict"`
	Inbound     bool    `json:"inbound"`
	Untracked   bool    `json:"untracked"`
	Bypass      bool    `json:"bypass"`
	IdleSeconds float64 `json:"idleSeconds"`
	Table       string  `json:"table"` // where the verdict is kept: flows, or nat (a masqueraded TCP flow set up in BPF)

	f Flow
}

func runFlows(ctx *view.Context, pod string) error {
	if err := ctx.CheckRoot(); err != nil {
		return err
	}
	var only net.IP
	if pod != "" {
		if only = net.ParseIP(pod); only == nil {
			return view.Usage("--pod %q is not an IP address", pod)
		}
	}
	ms, closeMaps, err := ctx.OpenMaps(maps.CniMapFlows, maps.CniMapXlatLease, maps.CniMapNat, maps.CniMapNatTimeouts)
	if err != nil {
		return err
	}
	defer closeMaps()
	out, err := readFlows(ms, only)
	if err != nil {
		return err
	}
	if ctx.JSON {
		return view.WriteJSON(ctx.Stdout, out)
	}
	lease, err := leaseLine(ms[maps.CniMapXlatLease])
	if err != nil {
		return err
	}
	return writeFlows(ctx, out, lease)
}

// entryOf is f as the CLI shows it; table is the map its verdict is in.
func entryOf(f Flow, table string) *FlowEntry {
	return &FlowEntry{Proto: view.ProtoName(f.Proto), Pod: f.Pod.String(), PodPort: f.PodPort, Remote: f.Remote.String(),
		RemotePort: f.RemotePort, Verdict: VerdictNames[f.Verdict], Inbound: f.Inbound, Untracked: f.Untracked, Bypass: f.Bypass,
		IdleSeconds: f.Idle.Seconds(), Table: table, f: f}
}

// readFlows lists the flows of the flow table and the masqueraded TCP
// flows set up in BPF, whose verdicts are in the NAT table (of the pod
// only, unless nil), ordered by pod, protocol and remote.
func readFlows(ms map[string]*ebpf.Map, only net.IP) ([]*FlowEntry, error) {
	out := []*FlowEntry{}
	if m := ms[maps.CniMapFlows]; m != nil {
		list, err := List(m)
		if err != nil {
			return nil, err
		}
		for _, f := range list {
			if only == nil || f.Pod.Equal(only) {
				out = append(out, entryOf(f, maps.CniMapFlows))
			}
		}
	}
	if m := ms[maps.CniMapNat]; m != nil {
		nat, err := conntrack.NewTable(m, ms[maps.CniMapNatTimeouts]).Flows()
		if err != nil {
			return nil, err
		}
		for _, n := range nat {
			if !n.Bypass || n.Expired || (only != nil && !n.Pod.Equal(only)) {
				continue
			}
			out = append(out, entryOf(Flow{Proto: n.Proto, Pod: n.Pod, PodPort: n.PodPort, Remote: n.Remote, RemotePort: n.RemotePort,
				Verdict: maps.CniFlowVerdictFLOW_FAST, Bypass: true, Idle: n.Idle}, maps.CniMapNat))
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		return view.FlowLess(a.f.Pod, b.f.Pod, a.Proto, b.Proto, a.f.Remote, b.f.Remote, a.PodPort, b.PodPort)
	})
	return out, nil
}

// leaseLine says whether the translated destinations' lease in m (nil: not
// pinned) runs.
func leaseLine(m *ebpf.Map) (string, error) {
	if m == nil {
		return "never written: every new flow meets netfilter", nil
	}
	l, err := ReadLease(m)
	if err != nil {
		return "", err
	}
	switch {
	case l.Valid():
		return fmt.Sprintf("runs for %s more (%d destinations, write %d): new flows to others skip netfilter", l.Left.Round(time.Second), l.Entries, l.Generation), nil
	case l.Generation > 0:
		return fmt.Sprintf("expired (renewed %s ago): every new flow meets netfilter", l.Renewed.Round(time.Second)), nil
	}
	return "never written: every new flow meets netfilter", nil
}

func writeFlows(ctx *view.Context, out []*FlowEntry, lease string) error {
	if len(out) == 0 {
		fmt.Fprintln(ctx.Stdout, "no tracked flows")
		fmt.Fprintf(ctx.Stdout, "translated destinations' lease (%s): %s\n", maps.CniMapXlatLease, lease)
		return nil
	}
	t := &view.Table{Header: []string{"PROTO", "POD", "REMOTE", "VERDICT", "IDLE"}, Right: map[int]bool{4: true}}
	for _, f := range out {
		v := f.Verdict
		if f.Inbound {
			v += ",inbound"
		}
		if f.Untracked {
			v += ",untracked"
		}
		if f.Bypass {
			v += ",bypass"
		}
		if f.Table == maps.CniMapNat {
			v += " (nat)"
		}
		t.Row(f.Proto, net.JoinHostPort(f.Pod, strconv.Itoa(int(f.PodPort))), net.JoinHostPort(f.Remote, strconv.Itoa(int(f.RemotePort))),
			v, view.HumanAge(f.f.Idle))
	}
	if err := t.Write(ctx.Stdout); err != nil {
		return err
	}
	fmt.Fprintf(ctx.Stdout, "\n%d flow(s)\n", len(out))
	fmt.Fprintf(ctx.Stdout, "translated destinations' lease (%s): %s\n", maps.CniMapXlatLease, lease)
	return nil
}
