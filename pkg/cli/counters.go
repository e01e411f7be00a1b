package cli

import (
	"flag"
	"fmt"
	"sort"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/counters"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

func init() {
	register(&Command{
		Name:    "counters",
		Summary: "packets forwarded, redirected, passed and dropped by reason and direction, per endpoint and in total",
		Help: `What the programs did with the packets of each pod, by reason:
redirect (redirect_peer into another pod), fib_redirect (forwarded through
the FIB), pass (handed to the node's stack), arp_reply (ARP answered in BPF)
and drop_* (dropped, with why: drop_spoof_src, drop_spoof_mac,
drop_malformed, drop_no_endpoint, drop_policy_ingress and
drop_policy_egress for what NetworkPolicy denies), and by direction:
egress (leaving the pod; on an uplink, leaving the node), ingress
(arriving). A device counts what its programs did: a policy denial on the
device whose program dropped the packet (the sending pod's host veth, the
uplink, the tunnel device or the receiving pod's host veth); 'ebpf-cni
policy' counts denials by the pod whose policy denied them. Counts are
packets and bytes summed over CPUs. Per endpoint they come from
device_counters (keyed by host ifindex; DEL removes an endpoint's), the
node total from node_counters (everything since the maps were created,
deleted pods included; an upgrade from a build without directions starts
them again). Tables show only non-zero reasons; EGRESS and INGRESS are
packets.

JSON: {"total": {"reasons": {<reason>: {"packets", "bytes"}}, "dropped",
"directions": {"egress": {<reason>: ...}, "ingress": {...}}},
"endpoints": [{"containerID", "ifname", "hostVeth", "hostIfindex",
"reasons", "dropped", "directions"}]}; "reasons" sums both directions;
every reason is present, zeros included.`,
		Flags: func(*flag.FlagSet) func(*Context) error { return runCounters },
	})
}

// CounterValue is a packet and byte count.
type CounterValue struct {
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

// ReasonCounters are the counts of one device or of the node.
type ReasonCounters struct {
	Reasons map[string]CounterValue `json:"reasons"` // both directions
	Dropped CounterValue            `json:"dropped"` // sum of the drop_* reasons
	// Directions: "egress" and "ingress" -> reason -> counts.
	Directions map[string]map[string]CounterValue `json:"directions"`
}

// EndpointCounters are one endpoint's (or device's) counts.
type EndpointCounters struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
	HostVeth    string `json:"hostVeth"`
	HostIfIndex int    `json:"hostIfindex"`
	ReasonCounters
}

type countersOutput struct {
	Total     ReasonCounters      `json:"total"`
	Endpoints []*EndpointCounters `json:"endpoints"`
}

// reasons lists the known reasons in enum order.
func reasons() []maps.CniPktReason {
	out := make([]maps.CniPktReason, 0, len(maps.PktReasons))
	for _, r := range maps.PktReasons {
		out = append(out, r.Reason)
	}
	return out
}

func reasonCounters(by map[maps.CniPktReason]counters.ByDir) ReasonCounters {
	rc := ReasonCounters{Reasons: map[string]CounterValue{}, Directions: map[string]map[string]CounterValue{}}
	for _, d := range counters.Dirs {
		rc.Directions[counters.DirKeys[d]] = map[string]CounterValue{}
	}
	for _, r := range reasons() {
		b := by[r]
		c := b.Total()
		rc.Reasons[counters.ReasonKeys[r]] = CounterValue{c.Packets, c.Bytes}
		for _, d := range counters.Dirs {
			rc.Directions[counters.DirKeys[d]][counters.ReasonKeys[r]] = CounterValue{b[d].Packets, b[d].Bytes}
		}
		if counters.IsDrop(r) {
			rc.Dropped.Packets += c.Packets
			rc.Dropped.Bytes += c.Bytes
		}
	}
	return rc
}

func readCounters(ctx *Context) (*countersOutput, error) {
	n, err := loadNode(ctx)
	if err != nil {
		return nil, err
	}
	ms, closeMaps, err := ctx.OpenMaps(append([]string{maps.CniMapNodeCounters}, counters.DeviceMaps...)...)
	if err != nil {
		return nil, err
	}
	defer closeMaps()
	total := map[maps.CniPktReason]counters.ByDir{}
	if m := ms[maps.CniMapNodeCounters]; m != nil {
		if total, err = counters.SumNode(m); err != nil {
			return nil, err
		}
	}
	devs, err := counters.DevicesOf(ms).Sum()
	if err != nil {
		return nil, err
	}
	out := &countersOutput{Total: reasonCounters(total), Endpoints: []*EndpointCounters{}}
	for _, e := range n.Endpoints {
		out.Endpoints = append(out.Endpoints, &EndpointCounters{ContainerID: e.ContainerID, IfName: e.IfName,
			HostVeth: e.HostVeth, HostIfIndex: e.HostIfIndex, ReasonCounters: reasonCounters(devs[uint32(e.HostIfIndex)])})
	}
	// Devices counted that are no endpoint: removed without DEL, or a
	// program attached by hand.
	var others []int
	for idx := range devs {
		if n.byIfIndex[int(idx)] == nil {
			others = append(others, int(idx))
		}
	}
	sort.Ints(others)
	for _, idx := range others {
		name := ""
		if l, err := netlink.LinkByIndex(idx); err == nil {
			name = l.Attrs().Name
		}
		out.Endpoints = append(out.Endpoints, &EndpointCounters{HostVeth: name, HostIfIndex: idx, ReasonCounters: reasonCounters(devs[uint32(idx)])})
	}
	return out, nil
}

func runCounters(ctx *Context) error {
	out, err := readCounters(ctx)
	if err != nil {
		return err
	}
	if ctx.JSON {
		return writeJSON(ctx.Stdout, out)
	}
	t := &view.Table{Header: []string{"ENDPOINT", "HOST VETH", "REASON", "PACKETS", "BYTES", "EGRESS", "INGRESS", "MEANING"}, Right: map[int]bool{3: true, 4: true, 5: true, 6: true}}
	rows := func(first, veth string, rc ReasonCounters) {
		any := false
		for _, r := range reasons() {
			c := rc.Reasons[counters.ReasonKeys[r]]
			if c.Packets == 0 {
				continue
			}
			k := counters.ReasonKeys[r]
			t.Row(first, veth, k, view.HumanCount(c.Packets), view.HumanBytes(c.Bytes),
				view.HumanCount(rc.Directions["egress"][k].Packets), view.HumanCount(rc.Directions["ingress"][k].Packets), counters.ReasonNames[r])
			first, veth, any = "", "", true
		}
		if !any {
			t.Row(first, veth, "(no packets)")
		}
	}
	for _, e := range out.Endpoints {
		name := view.Name(e.ContainerID, e.IfName)
		if e.ContainerID == "" {
			name = fmt.Sprintf("(ifindex %d)", e.HostIfIndex)
		}
		rows(name, orDash(e.HostVeth), e.ReasonCounters)
	}
	rows("node total", "", out.Total)
	return t.Write(ctx.Stdout)
}
