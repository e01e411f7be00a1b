package cli

import (
	"bytes"
	"flag"
	"fmt"
	"net"
	"sort"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

func init() {
	register(&Command{
		Name:    "ipam",
		Summary: "addresses ebpf-ipam has handed out, per network",
		Help: `Every address held in the pinned allocation map (ipam_allocs), by network:
the holder (container ID, ifname), the range set it came from, and how long
ago it was allocated. Network names come from ipam_nets. Only ebpf-ipam's
allocations are here (not host-local's).

JSON: a list of networks {"network", "netID", "allocations": [{"address",
"family", "containerID", "ifname", "rangeSet", "allocated" (unix seconds)}]},
networks by name, addresses in order.`,
		Flags: func(fs *flag.FlagSet) func(*Context) error {
			network := fs.String("network", "", "show only the network named `NAME`")
			return func(ctx *Context) error { return runIPAM(ctx, *network) }
		},
	})
}

// Allocation is one address held by an attachment.
type Allocation struct {
	Address     string `json:"address"`
	Family      int    `json:"family"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
	RangeSet    uint32 `json:"rangeSet"`
	Allocated   uint64 `json:"allocated"`

	ip net.IP
}

// NetworkAllocations are the allocations of one network.
type NetworkAllocations struct {
	Network     string        `json:"network"`
	NetID       uint32        `json:"netID"`
	Allocations []*Allocation `json:"allocations"`
}

func readIPAM(ctx *Context, only string) ([]*NetworkAllocations, error) {
	if err := ctx.CheckRoot(); err != nil {
		return nil, err
	}
	ms, closeMaps, err := ctx.OpenMaps(maps.CniMapIpamAllocs, maps.CniMapIpamNets)
	if err != nil {
		return nil, err
	}
	defer closeMaps()
	names := map[uint32]string{}
	if m := ms[maps.CniMapIpamNets]; m != nil {
		var id uint32
		var v maps.CniIpamNet
		it := m.Iterate()
		for it.Next(&id, &v) {
			names[id] = maps.GoString(v.Name[:])
		}
		if err := it.Err(); err != nil {
			return nil, fmt.Errorf("reading %s: %w", maps.CniMapIpamNets, err)
		}
	}
	byNet := map[uint32]*NetworkAllocations{}
	seen := map[maps.CniIpamKey]bool{} // an iteration restarted by a concurrent delete repeats keys
	if m := ms[maps.CniMapIpamAllocs]; m != nil {
		var k maps.CniIpamKey
		var v maps.CniIpamOwner
		it := m.Iterate()
		for it.Next(&k, &v) {
			if seen[k] {
				continue
			}
			seen[k] = true
			na := byNet[k.NetId]
			if na == nil {
				name := names[k.NetId]
				if name == "" {
					name = fmt.Sprintf("(net %#x)", k.NetId)
				}
				na = &NetworkAllocations{Network: name, NetID: k.NetId, Allocations: []*Allocation{}}
				byNet[k.NetId] = na
			}
			ip := maps.IP(k.Family, k.Addr)
			na.Allocations = append(na.Allocations, &Allocation{Address: ip.String(), Family: int(k.Family),
				ContainerID: maps.GoString(v.ContainerId[:]), IfName: maps.GoString(v.Ifname[:]), RangeSet: v.RangeSet, Allocated: v.AllocTime, ip: ip})
		}
		if err := it.Err(); err != nil {
			return nil, fmt.Errorf("reading %s: %w", maps.CniMapIpamAllocs, err)
		}
	}
	out := []*NetworkAllocations{}
	for _, na := range byNet {
		if only != "" && na.Network != only {
			continue
		}
		sort.Slice(na.Allocations, func(i, j int) bool {
			a, b := na.Allocations[i], na.Allocations[j]
			if a.Family != b.Family {
				return a.Family < b.Family
			}
			return bytes.Compare(a.ip, b.ip) < 0
		})
		out = append(out, na)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Network < out[j].Network })
	return out, nil
}

func runIPAM(ctx *Context, only string) error {
	nets, err := readIPAM(ctx, only)
	if err != nil {
		return err
	}
	if ctx.JSON {
		return writeJSON(ctx.Stdout, nets)
	}
	if len(nets) == 0 {
		fmt.Fprintln(ctx.Stdout, "no addresses allocated")
		return nil
	}
	t := &view.Table{Header: []string{"NETWORK", "ADDRESS", "CONTAINER/IFNAME", "RANGE SET", "AGE"}, Right: map[int]bool{3: true, 4: true}}
	now := time.Now()
	for _, na := range nets {
		for _, a := range na.Allocations {
			age := "-"
			if a.Allocated != 0 {
				age = view.HumanAge(now.Sub(time.Unix(int64(a.Allocated), 0)))
			}
			t.Row(na.Network, a.Address, (&Endpoint{ContainerID: a.ContainerID, IfName: a.IfName}).Name(), fmt.Sprint(a.RangeSet), age)
		}
	}
	if err := t.Write(ctx.Stdout); err != nil {
		return err
	}
	fmt.Fprintln(ctx.Stdout)
	for _, na := range nets {
		fmt.Fprintf(ctx.Stdout, "%s: %d address(es)\n", na.Network, len(na.Allocations))
	}
	return nil
}
