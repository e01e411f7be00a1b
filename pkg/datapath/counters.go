package datapath

import (
	"fmt"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// ReasonNames names the pkt_counters indexes (enum pkt_reason).
var ReasonNames = map[maps.CniPktReason]string{
	maps.CniPktReasonREASON_PASS:             "pass to stack",
	maps.CniPktReasonREASON_REDIRECT:         "redirect_peer to pod",
	maps.CniPktReasonREASON_DROP_MALFORMED:   "drop: malformed",
	maps.CniPktReasonREASON_DROP_SPOOF_SRC:   "drop: spoofed source IP",
	maps.CniPktReasonREASON_DROP_SPOOF_MAC:   "drop: spoofed source MAC",
	maps.CniPktReasonREASON_FIB_REDIRECT:     "fib_lookup + redirect",
	maps.CniPktReasonREASON_ARP_REPLY:        "ARP answered in BPF",
	maps.CniPktReasonREASON_DROP_NO_ENDPOINT: "drop: no endpoint",
}

// Counter is one reason's total over all CPUs.
type Counter struct{ Packets, Bytes uint64 }

// ReadCounters sums pkt_counters over CPUs.
func ReadCounters(bpfRoot string) (map[maps.CniPktReason]Counter, error) {
	path := filepath.Join(maps.Dir(bpfRoot), maps.CniMapPktCounters)
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	defer m.Close()
	out := map[maps.CniPktReason]Counter{}
	var k uint32
	var vals []maps.CniPktCounter
	it := m.Iterate()
	for it.Next(&k, &vals) {
		var c Counter
		for _, v := range vals {
			c.Packets += v.Packets
			c.Bytes += v.Bytes
		}
		out[maps.CniPktReason(k)] = c
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return out, nil
}
