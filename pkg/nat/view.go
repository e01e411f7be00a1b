package nat

import (
	"flag"
	"fmt"
	"net"
	"sort"
	"strconv"

	"github.com/ebpf-cni/ebpf-cni/pkg/conntrack"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

// command is the operator CLI's nat command.
var command = &view.Command{
	Name:    "nat",
	Summary: "masquerade flows: conntrack/NAT entries with age and state",
	Help: `Every flow in the pinned conntrack/NAT table (nat): protocol, the pod's
address and port (ICMP echo: identifier), the remote, the address and port
the remote sees, the state (syn-sent, established, closing; open for UDP
and ICMP), whether the pod's own port was kept, whether a reply came, how
long ago it started and was last used. bypass: a TCP flow set up in BPF
(the node agent's set of destinations netfilter may translate did not hold
the remote): fast both ways for its life, its verdict kept here instead of
in the flow table (ebpf-cni flows lists it too). Expired flows are still
listed until GC deletes them; the programs already ignore them.

JSON: a list of {"proto", "pod", "podPort", "remote", "remotePort", "nat",
"natPort", "state", "kept", "replied", "bypass", "ageSeconds",
"idleSeconds", "expired"}, ordered by pod, protocol and remote.`,
	Flags: func(fs *flag.FlagSet) func(*view.Context) error {
		pod := fs.String("pod", "", "show only the flows of the pod address `IP`")
		return func(ctx *view.Context) error { return runNAT(ctx, *pod) }
	},
}

// NATFlow is one flow as the CLI shows it.
type NATFlow struct {
	Proto       string  `json:"proto"`
	Pod         string  `json:"pod"`
	PodPort     uint16  `json:"podPort"`
	Remote      string  `json:"remote"`
	RemotePort  uint16  `json:"remotePort"`
	NAT         string  `json:"nat"`
	NATPort     uint16  `json:"natPort"`
	State       string  `json:"state"`
	Kept        bool    `json:"kept"`
	Replied     bool    `json:"replied"`
	Bypass      bool    `json:"bypass"`
	AgeSeconds  float64 `json:"ageSeconds"`
	IdleSeconds float64 `json:"idleSeconds"`
	Expired     bool    `json:"expired"`

	f conntrack.Flow
}

func readNAT(ctx *view.Context, pod string) ([]*NATFlow, error) {
	if err := ctx.CheckRoot(); err != nil {
		return nil, err
	}
	var only net.IP
	if pod != "" {
		if only = net.ParseIP(pod); only == nil {
			return nil, view.Usage("--pod %q is not an IP address", pod)
		}
	}
	ms, closeMaps, err := ctx.OpenMaps(maps.CniMapNat, maps.CniMapNatTimeouts)
	if err != nil {
		return nil, err
	}
	defer closeMaps()
	out := []*NATFlow{}
	if ms[maps.CniMapNat] == nil {
		return out, nil
	}
	t := conntrack.NewTable(ms[maps.CniMapNat], ms[maps.CniMapNatTimeouts])
	flows, err := t.Flows()
	if err != nil {
		return nil, err
	}
	for _, f := range flows {
		if only != nil && !f.Pod.Equal(only) {
			continue
		}
		proto := view.ProtoName(f.Proto)
		out = append(out, &NATFlow{Proto: proto, Pod: f.Pod.String(), PodPort: f.PodPort, Remote: f.Remote.String(), RemotePort: f.RemotePort,
			NAT: f.NAT.String(), NATPort: f.NATPort, State: conntrack.StateNames[f.State], Kept: f.Kept, Replied: f.Replied,
			Bypass: f.Bypass, AgeSeconds: f.Age.Seconds(), IdleSeconds: f.Idle.Seconds(), Expired: f.Expired, f: f})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		return view.FlowLess(a.f.Pod, b.f.Pod, a.Proto, b.Proto, a.f.Remote, b.f.Remote, a.PodPort, b.PodPort)
	})
	return out, nil
}

func runNAT(ctx *view.Context, pod string) error {
	flows, err := readNAT(ctx, pod)
	if err != nil {
		return err
	}
	if ctx.JSON {
		return view.WriteJSON(ctx.Stdout, flows)
	}
	if len(flows) == 0 {
		fmt.Fprintln(ctx.Stdout, "no masqueraded flows")
		return nil
	}
	t := &view.Table{Header: []string{"PROTO", "POD", "REMOTE", "SEEN AS", "STATE", "AGE", "IDLE"}, Right: map[int]bool{5: true, 6: true}}
	for _, f := range flows {
		state := f.State
		if f.Kept {
			state += ",kept"
		}
		if f.Bypass {
			state += ",bypass"
		}
		if f.Expired {
			state += ",expired"
		}
		t.Row(f.Proto, net.JoinHostPort(f.Pod, strconv.Itoa(int(f.PodPort))), net.JoinHostPort(f.Remote, strconv.Itoa(int(f.RemotePort))),
			net.JoinHostPort(f.NAT, strconv.Itoa(int(f.NATPort))), state, view.HumanAge(f.f.Age), view.HumanAge(f.f.Idle))
	}
	if err := t.Write(ctx.Stdout); err != nil {
		return err
	}
	fmt.Fprintf(ctx.Stdout, "\n%d flow(s)\n", len(flows))
	return nil
}
