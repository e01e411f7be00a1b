package bandwidth

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

// command is the operator CLI's bandwidth command.
var command = &view.Command{
	Name:    "bandwidth",
	Summary: "each endpoint's rate limits, the state of its token buckets and what they dropped",
	Help: `The rate limits the programs enforce, from bw_buckets (keyed by host
ifindex; only pods with a limit have an entry): per endpoint and direction
(egress: what the pod sends; ingress: what is delivered to it) the rate in
bits per second, the burst in bits, the mode (police: drop over the rate;
edt: the host veth has fq and the stack's traffic to the pod is paced by
departure time), the bucket's debt now (how far its clock runs ahead: 0 is
a full bucket) and the packets and bytes dropped over the rate. PACED: the
pacing hook is on the cgroup and the pod's netns is in local_netns, so TCP
the pod sends (and TCP the node and its pods send to it) is paced at its
source to the limit; traffic from outside the node is policed only.

JSON: [{"containerID", "ifname", "hostVeth", "hostIfindex", "paced",
"egress", "ingress"}], each direction null when unlimited, else {"rate",
"burst", "mode", "debtNs", "drops", "dropBytes"}; sorted by host ifindex.`,
	Flags: func(*flag.FlagSet) func(*view.Context) error { return runBandwidth },
}

// BucketState is one direction of an endpoint's limits.
type BucketState struct {
	Rate      uint64 `json:"rate"`  // bits per second
	Burst     uint64 `json:"burst"` // bits
	Mode      string `json:"mode"`  // police or edt
	DebtNs    uint64 `json:"debtNs"`
	Drops     uint64 `json:"drops"`
	DropBytes uint64 `json:"dropBytes"`
}

// EndpointBandwidth is one endpoint's limits.
type EndpointBandwidth struct {
	ContainerID string       `json:"containerID"`
	IfName      string       `json:"ifname"`
	HostVeth    string       `json:"hostVeth"`
	HostIfIndex int          `json:"hostIfindex"`
	Paced       bool         `json:"paced"`
	Egress      *BucketState `json:"egress"`
	Ingress     *BucketState `json:"ingress"`
}

func bucketState(b maps.CniBwBucket, now uint64) *BucketState {
	if b.NsPerByte == 0 {
		return nil
	}
	s := &BucketState{Rate: b.Rate, Burst: b.Burst, Mode: "police", Drops: b.Drops, DropBytes: b.DropBytes}
	if b.Flags&uint64(maps.CniBwFlagsBW_F_EDT) != 0 {
		s.Mode = "edt"
	}
	if b.Tat > now {
		s.DebtNs = b.Tat - now
	}
	return s
}

func readBandwidth(ctx *view.Context) ([]*EndpointBandwidth, error) {
	eps, err := ctx.Endpoints()
	if err != nil {
		return nil, err
	}
	byIfIndex := map[int]view.EndpointRef{}
	for _, e := range eps {
		byIfIndex[e.HostIfIndex] = e
	}
	ms, closeMaps, err := ctx.OpenMaps(maps.CniMapBwBuckets, maps.CniMapLocalNetns)
	if err != nil {
		return nil, err
	}
	defer closeMaps()
	out := []*EndpointBandwidth{}
	m := ms[maps.CniMapBwBuckets]
	if m == nil {
		return out, nil
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil { // bpf_ktime_get_ns's clock
		return nil, fmt.Errorf("reading the monotonic clock: %w", err)
	}
	now := uint64(ts.Nano())
	netns := map[int]bool{}
	if nm := ms[maps.CniMapLocalNetns]; nm != nil {
		var c uint64
		var i uint32
		for it := nm.Iterate(); it.Next(&c, &i); {
			netns[int(i)] = true
		}
	}
	_, err = os.Stat(filepath.Join(feature.CgroupDir(ctx.Node), PacingHooks[0].Name))
	hook := err == nil
	var k uint32
	var v maps.CniBwState
	it := m.Iterate()
	for it.Next(&k, &v) {
		e := &EndpointBandwidth{HostIfIndex: int(k), Paced: hook && netns[int(k)],
			Egress: bucketState(v.Egress, now), Ingress: bucketState(v.Ingress, now)}
		if ep, ok := byIfIndex[int(k)]; ok {
			e.ContainerID, e.IfName, e.HostVeth = ep.ContainerID, ep.IfName, ep.HostVeth
		}
		out = append(out, e)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterating %s: %w", maps.CniMapBwBuckets, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].HostIfIndex < out[j].HostIfIndex })
	return out, nil
}

// humanRate is bits per second with a decimal unit.
func humanRate(bps uint64) string {
	return view.Scaled(bps, 1000, []string{"bit/s", "kbit/s", "Mbit/s", "Gbit/s", "Tbit/s"}, " ")
}

func runBandwidth(ctx *view.Context) error {
	out, err := readBandwidth(ctx)
	if err != nil {
		return err
	}
	if ctx.JSON {
		return view.WriteJSON(ctx.Stdout, out)
	}
	t := &view.Table{Header: []string{"ENDPOINT", "HOST VETH", "PACED", "DIRECTION", "RATE", "BURST", "MODE", "DEBT", "DROPS", "DROPPED"},
		Right: map[int]bool{4: true, 5: true, 7: true, 8: true, 9: true}}
	for _, e := range out {
		name := view.Name(e.ContainerID, e.IfName)
		if e.ContainerID == "" {
			name = fmt.Sprintf("(ifindex %d, no endpoint)", e.HostIfIndex)
		}
		veth, paced := view.OrDash(e.HostVeth), "no"
		if e.Paced {
			paced = "yes"
		}
		for _, d := range []struct {
			dir string
			b   *BucketState
		}{{"egress", e.Egress}, {"ingress", e.Ingress}} {
			if d.b == nil {
				t.Row(name, veth, paced, d.dir, "unlimited")
			} else {
				t.Row(name, veth, paced, d.dir, humanRate(d.b.Rate), view.HumanBytes(d.b.Burst/8), d.b.Mode,
					time.Duration(d.b.DebtNs).Round(time.Microsecond).String(), view.HumanCount(d.b.Drops), view.HumanBytes(d.b.DropBytes))
			}
			name, veth, paced = "", "", ""
		}
	}
	if len(out) == 0 {
		t.Row("(no endpoint has a limit)")
	}
	return t.Write(ctx.Stdout)
}
