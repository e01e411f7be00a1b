// Package counters reads what the programs account for: pkt_counters
// (node-wide, per reason) and endpoint_counters (per device and reason),
// and names the reasons (enum pkt_reason) for people and for JSON.
package counters

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// ReasonNames names the pkt_counters indexes (enum pkt_reason).
var ReasonNames = map[maps.CniPktReason]string{
	maps.CniPktReasonREASON_PASS:                 "pass to stack",
	maps.CniPktReasonREASON_REDIRECT:             "redirect_peer to pod",
	maps.CniPktReasonREASON_DROP_MALFORMED:       "drop: malformed",
	maps.CniPktReasonREASON_DROP_SPOOF_SRC:       "drop: spoofed source IP",
	maps.CniPktReasonREASON_DROP_SPOOF_MAC:       "drop: spoofed source MAC",
	maps.CniPktReasonREASON_FIB_REDIRECT:         "fib_lookup + redirect",
	maps.CniPktReasonREASON_ARP_REPLY:            "ARP answered in BPF",
	maps.CniPktReasonREASON_DROP_NO_ENDPOINT:     "drop: no endpoint",
	maps.CniPktReasonREASON_SNAT:                 "masquerade: source translated",
	maps.CniPktReasonREASON_REV_SNAT:             "masquerade: reply translated to pod",
	maps.CniPktReasonREASON_DROP_NAT_NO_PORT:     "drop: no free masquerade port",
	maps.CniPktReasonREASON_DROP_NAT_UNSUPPORTED: "drop: cannot masquerade",
	maps.CniPktReasonREASON_DROP_NAT_NO_ADDR:     "drop: uplink has no address",
	maps.CniPktReasonREASON_DROP_BW_EGRESS:       "drop: over egress rate",
	maps.CniPktReasonREASON_DROP_BW_INGRESS:      "drop: over ingress rate",
	maps.CniPktReasonREASON_DNAT:                 "hostPort: translated to pod",
	maps.CniPktReasonREASON_REV_DNAT:             "hostPort: reply translated back",
	maps.CniPktReasonREASON_STACK_REPLY:          "reply to stack-NATed flow, to stack",
	maps.CniPktReasonREASON_FROM_STACK:           "delivered to pod by the stack",
	maps.CniPktReasonREASON_TO_QDISC:             "to another plugin's ingress qdisc",
	maps.CniPktReasonREASON_VIA_QDISC:            "delivered through the root qdisc",
	maps.CniPktReasonREASON_FLOW_NEW:             "new flow to the stack (netfilter)",
	maps.CniPktReasonREASON_FLOW_STACK:           "to a pod through the stack (netfilter)",
	maps.CniPktReasonREASON_ROUTED_IN:            "routed in straight to a pod",
	maps.CniPktReasonREASON_TUNNEL_ENCAP:         "into the overlay",
	maps.CniPktReasonREASON_TUNNEL_DECAP:         "from the overlay to a pod",
	maps.CniPktReasonREASON_DROP_TUNNEL:          "drop: overlay unavailable",
}

// ReasonKeys are stable machine names of the reasons (the C enum names,
// lower case, without REASON_), for JSON and scripts. Drop reasons start
// with "drop_".
var ReasonKeys = map[maps.CniPktReason]string{
	maps.CniPktReasonREASON_PASS:                 "pass",
	maps.CniPktReasonREASON_REDIRECT:             "redirect",
	maps.CniPktReasonREASON_DROP_MALFORMED:       "drop_malformed",
	maps.CniPktReasonREASON_DROP_SPOOF_SRC:       "drop_spoof_src",
	maps.CniPktReasonREASON_DROP_SPOOF_MAC:       "drop_spoof_mac",
	maps.CniPktReasonREASON_FIB_REDIRECT:         "fib_redirect",
	maps.CniPktReasonREASON_ARP_REPLY:            "arp_reply",
	maps.CniPktReasonREASON_DROP_NO_ENDPOINT:     "drop_no_endpoint",
	maps.CniPktReasonREASON_SNAT:                 "snat",
	maps.CniPktReasonREASON_REV_SNAT:             "rev_snat",
	maps.CniPktReasonREASON_DROP_NAT_NO_PORT:     "drop_nat_no_port",
	maps.CniPktReasonREASON_DROP_NAT_UNSUPPORTED: "drop_nat_unsupported",
	maps.CniPktReasonREASON_DROP_NAT_NO_ADDR:     "drop_nat_no_addr",
	maps.CniPktReasonREASON_DROP_BW_EGRESS:       "drop_bw_egress",
	maps.CniPktReasonREASON_DROP_BW_INGRESS:      "drop_bw_ingress",
	maps.CniPktReasonREASON_DNAT:                 "dnat",
	maps.CniPktReasonREASON_REV_DNAT:             "rev_dnat",
	maps.CniPktReasonREASON_STACK_REPLY:          "stack_reply",
	maps.CniPktReasonREASON_FROM_STACK:           "from_stack",
	maps.CniPktReasonREASON_TO_QDISC:             "to_qdisc",
	maps.CniPktReasonREASON_VIA_QDISC:            "via_qdisc",
	maps.CniPktReasonREASON_FLOW_NEW:             "flow_new",
	maps.CniPktReasonREASON_FLOW_STACK:           "flow_stack",
	maps.CniPktReasonREASON_ROUTED_IN:            "routed_in",
	maps.CniPktReasonREASON_TUNNEL_ENCAP:         "tunnel_encap",
	maps.CniPktReasonREASON_TUNNEL_DECAP:         "tunnel_decap",
	maps.CniPktReasonREASON_DROP_TUNNEL:          "drop_tunnel",
}

// IsDrop reports whether a reason is a drop.
func IsDrop(r maps.CniPktReason) bool { return strings.HasPrefix(ReasonKeys[r], "drop_") }

// Counter is one reason's total over all CPUs.
type Counter struct{ Packets, Bytes uint64 }

// Add adds c to the counter.
func (c *Counter) Add(o Counter) { c.Packets += o.Packets; c.Bytes += o.Bytes }

// ReadCounters sums pkt_counters over CPUs.
func ReadCounters(bpfRoot string) (map[maps.CniPktReason]Counter, error) {
	path := filepath.Join(maps.Dir(bpfRoot), maps.CniMapPktCounters)
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	defer m.Close()
	return SumCounters(m)
}

// SumCounters sums an open pkt_counters map over CPUs.
func SumCounters(m *ebpf.Map) (map[maps.CniPktReason]Counter, error) {
	out := map[maps.CniPktReason]Counter{}
	var k uint32
	var vals []maps.CniPktCounter
	it := m.Iterate()
	for it.Next(&k, &vals) {
		var c Counter
		for _, v := range vals {
			c.Add(Counter{v.Packets, v.Bytes})
		}
		out[maps.CniPktReason(k)] = c
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", maps.CniMapPktCounters, err)
	}
	return out, nil
}

// SumDeviceCounters sums an open endpoint_counters map over CPUs: ifindex
// -> reason -> counter. Entries deleted while it iterates are left out.
func SumDeviceCounters(m *ebpf.Map) (map[uint32]map[maps.CniPktReason]Counter, error) {
	out := map[uint32]map[maps.CniPktReason]Counter{}
	var k uint32
	var vals []maps.CniDevCounters
	it := m.Iterate()
	for it.Next(&k, &vals) {
		dev := map[maps.CniPktReason]Counter{}
		for _, v := range vals {
			for r, c := range v.ByReason {
				if c.Packets != 0 || c.Bytes != 0 {
					sum := dev[maps.CniPktReason(r)]
					sum.Add(Counter{c.Packets, c.Bytes})
					dev[maps.CniPktReason(r)] = sum
				}
			}
		}
		out[k] = dev
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", maps.CniMapEndpointCounters, err)
	}
	return out, nil
}

// DeleteDevices removes the per-device counters of ifindexes from m
// (endpoint_counters); a missing entry is fine.
func DeleteDevices(m *ebpf.Map, ifindexes ...int) error {
	var errs []error
	for _, i := range ifindexes {
		if err := m.Delete(uint32(i)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("deleting %s[%d]: %w", maps.CniMapEndpointCounters, i, err))
		}
	}
	return errors.Join(errs...)
}

// DeleteDeviceCounters is DeleteDevices on the map pinned under bpfRoot; a
// missing map is fine (DEL is idempotent and must not create maps).
func DeleteDeviceCounters(bpfRoot string, ifindexes ...int) error {
	path := filepath.Join(maps.Dir(bpfRoot), maps.CniMapEndpointCounters)
	m, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("opening %s: %w", path, err)
	}
	defer m.Close()
	return DeleteDevices(m, ifindexes...)
}

// DeviceKeys lists the ifindexes m (endpoint_counters) has entries for.
func DeviceKeys(m *ebpf.Map) ([]int, error) {
	devs, err := SumDeviceCounters(m)
	if err != nil {
		return nil, err
	}
	out := make([]int, 0, len(devs))
	for k := range devs {
		out = append(out, int(k))
	}
	return out, nil
}

// DeviceCounterKeys is DeviceKeys of the map pinned under bpfRoot.
func DeviceCounterKeys(bpfRoot string) ([]int, error) {
	path := filepath.Join(maps.Dir(bpfRoot), maps.CniMapEndpointCounters)
	m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	defer m.Close()
	return DeviceKeys(m)
}
