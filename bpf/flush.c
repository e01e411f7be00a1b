//go:build ignore

/* A DEL's flush of its pod's entries from the node's big LRU tables (nat,
 * flows), in the kernel.
 *
 * Those tables hold up to 131,072 and 65,536 entries, and the LRU keeps
 * them full on a node whose pods talk to the world a lot. Reading them
 * whole into the plugin to find one pod's entries cost such a node 40-45 ms
 * of every DEL, and as much CPU. These programs walk a table with
 * bpf_for_each_map_elem and delete the entries of the pods their context
 * lists (struct flush_args); they return how many they deleted. They are
 * pinned with the others and attached nowhere: pkg/podflush runs them with
 * BPF_PROG_TEST_RUN, one run per table, each with its own context, so
 * concurrent DELs share nothing.
 *
 * Deleting the entry being visited is what the walk allows: it takes the
 * next one first (hlist_nulls_for_each_entry_safe). */

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "include/types.h"
#include "lib/conntrack.h"
#include "lib/flow.h"

struct flush_walk {
	struct flush_args args;
	__u32 deleted;
};

/* listed is whether address addr of family is listed for table (enum
 * flush_tables). addr is 8-byte aligned in every key and value walked. */
static __always_inline int listed(const struct flush_args *a, __u8 family, const __u8 *addr, __u32 table)
{
	const __u64 *x = (const __u64 *)addr;

	for (int i = 0; i < FLUSH_MAX_PODS; i++) {
		const struct flush_pod *p = &a->pods[i];

		if (i >= a->n)
			break;
		if (p->family == family && (p->tables & table) &&
		    *(const __u64 *)p->addr == x[0] && *(const __u64 *)(p->addr + 8) == x[1])
			return 1;
	}
	return 0;
}

static long nat_elem(void *map, const struct nat_key *k, const struct nat_entry *v, struct flush_walk *w)
{
	/* The pod's address: the IN entry's value, the pod's tuple of the others. */
	const __u8 *pod = k->dir == NAT_DIR_IN ? v->addr : k->saddr;

	if (k->dir <= NAT_DIR_DNAT && listed(&w->args, k->family, pod, 1u << k->dir) &&
	    bpf_map_delete_elem(map, k) == 0)
		w->deleted++;
	return 0;
}

static long flow_elem(void *map, const struct flow_key *k, const struct flow_entry *v, struct flush_walk *w)
{
	if (listed(&w->args, k->family, k->saddr, FLUSH_FLOWS) && bpf_map_delete_elem(map, k) == 0)
		w->deleted++;
	return 0;
}

SEC("syscall")
int flush_nat(struct flush_args *a)
{
	struct flush_walk w = {.args = *a};

	bpf_for_each_map_elem(&nat, nat_elem, &w, 0);
	return w.deleted;
}

SEC("syscall")
int flush_flows(struct flush_args *a)
{
	struct flush_walk w = {.args = *a};

	bpf_for_each_map_elem(&flows, flow_elem, &w, 0);
	return w.deleted;
}

char __license[] SEC("license") = "GPL";
