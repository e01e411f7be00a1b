/* owner: shared */
/* The one place where programs account for what they did with a packet:
 * node-wide per reason and direction (node_counters) and per device (in
 * the device's slot of slot_counters, else in device_counters).
 *
 * These replace pkt_counters and endpoint_counters, which counted by
 * reason only: a pinned map keeps its layout for as long as it lives, so
 * the counters that gained a direction got new names (the programs of an
 * older build go on counting into the old maps until the upgrade swaps
 * them; the upgrade then unpins the old maps, maps.Retired). */
#ifndef EBPF_CNI_LIB_COUNTERS_H
#define EBPF_CNI_LIB_COUNTERS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "../include/types.h"

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, REASON_MAX);
	__type(key, enum pkt_reason); /* also puts the enum into BTF for bpf2go */
	__type(value, struct dir_counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} node_counters SEC(".maps");

/* Device ifindex -> its counters per reason and direction, for a device
 * that has no slot (below) and for the programs of builds before the
 * slots. The programs create an entry on such a device's first packet;
 * DEL and GC delete the entry of an endpoint they remove. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* memory grows with devices, not with the cap */
	__uint(max_entries, 16384);           /* as endpoint_devs */
	__type(key, __u32);
	__type(value, struct dev_counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} device_counters SEC(".maps");

/* Slot -> the ifindex of the device that owns it, 0 if free. A per-CPU
 * hash lookup costs a program run a sixth of its time (the hash, a bucket
 * and an element that are cache misses on a live path); an array slot is
 * an index the verifier inlines. A device's first packet claims the first
 * free one of its DEV_SLOT_PROBES slots (from its ifindex on) with a
 * compare-and-swap; DEL and GC zero its counters and free it when the
 * device is gone (pkg/counters). A device that finds its slots taken is
 * counted in device_counters. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, DEV_SLOTS);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} device_slots SEC(".maps");

/* Slot -> the counters of the device device_slots names. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, DEV_SLOTS);
	__type(key, __u32);
	__type(value, struct dev_counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} slot_counters SEC(".maps");

/* The first value of a device's counters: too big for the stack. */
static const struct dev_counters dev_counters_zero;

/* The counters in ifindex's slot, claiming a free one on its first packet;
 * NULL if its slots are taken. A free slot's counters are zero: who frees
 * it zeroes them first. Two CPUs claiming for the same device may take
 * two slots (a slot freed between their reads); readers add up every slot
 * a device owns. */
static __always_inline struct dev_counters *device_slot(__u32 ifindex)
{
	__u32 *claim = NULL, claim_key = 0;

	if (!ifindex)
		return NULL;
#pragma unroll
	for (__u32 i = 0; i < DEV_SLOT_PROBES; i++) {
		__u32 key = (ifindex + i) & (DEV_SLOTS - 1);
		__u32 *owner = bpf_map_lookup_elem(&device_slots, &key);
		__u32 o;

		if (!owner)
			return NULL;
		o = *(volatile __u32 *)owner;
		if (o == ifindex)
			return bpf_map_lookup_elem(&slot_counters, &key);
		if (!o && !claim) {
			claim = owner;
			claim_key = key;
		}
	}
	if (!claim)
		return NULL;
	__u32 was = __sync_val_compare_and_swap(claim, 0, ifindex);
	if (was && was != ifindex)
		return NULL; /* another device's now: the next packet looks again */
	return bpf_map_lookup_elem(&slot_counters, &claim_key);
}

static __always_inline void count_device(struct __sk_buff *skb, enum pkt_reason reason,
					 enum pkt_dir dir)
{
	__u32 ifindex = skb->ifindex;
	__u32 idx = reason;
	struct dev_counters *ec;

	ec = device_slot(ifindex);
	if (!ec)
		ec = bpf_map_lookup_elem(&device_counters, &ifindex);
	if (!ec) {
		/* The new element is zero on every CPU. BPF_NOEXIST: another CPU
		 * may have created it meanwhile; then the lookup finds that one. A
		 * full map only costs the per-device count, never the packet. */
		bpf_map_update_elem(&device_counters, &ifindex, &dev_counters_zero, BPF_NOEXIST);
		ec = bpf_map_lookup_elem(&device_counters, &ifindex);
		if (!ec)
			return;
	}
	/* The barrier keeps clang from reusing an earlier comparison on
	 * another register: the verifier rejects by_reason[idx] as "unbounded
	 * memory access" unless the check is on the register it indexes with. */
	asm volatile("" : "+r"(idx));
	if (idx >= REASON_MAX || dir >= PKT_DIR_MAX)
		return;
	ec->by_reason[idx].by_dir[dir].packets++;
	ec->by_reason[idx].by_dir[dir].bytes += skb->len;
}

/* dir is the program's (verdict()'s): a constant once inlined. */
static __always_inline void count_packet(struct __sk_buff *skb, enum pkt_reason reason,
					 enum pkt_dir dir)
{
	enum pkt_reason idx = reason;
	struct dir_counters *c = bpf_map_lookup_elem(&node_counters, &idx);

	if (c && dir < PKT_DIR_MAX) {
		c->by_dir[dir].packets++;
		c->by_dir[dir].bytes += skb->len;
	}
	count_device(skb, reason, dir);
}

#endif
