//go:build ignore

/* Every map shared between binaries and programs, in one object.
 *
 * It holds no program: pkg/maps generates the map specs and the Go types of
 * their keys and values from it, so ebpf-ipam can create and pin the maps
 * without loading (and verifying) any program. The programs declare the same
 * maps through the same headers and find them pinned by name. */

#define EBPF_CNI_MAPS_ONLY
#include "include/types.h"
#include "lib/counters.h"
#include "lib/ipam.h"
#include "lib/endpoint.h"
#include "lib/bandwidth.h"
#include "lib/conntrack.h"
#include "lib/nat.h"
#include "lib/uplink.h"
#include "lib/published_ports.h"
#include "lib/hostport.h"
#include "lib/pacing.h"
#include "lib/flow.h"
#include "lib/xlat.h"
#include "lib/cluster.h"
#include "lib/events.h"
#include "lib/pods.h"
#include "lib/node.h"
#include "lib/policy.h"

/* bpf2go generates Go only for types the object's BTF holds, and an enum is
 * there only when something has its type. go_enums has: it lists every enum
 * whose values the Go side uses (flags, NAT states and directions,
 * constants), and struct event, so pkg/maps generates them with -type and
 * none is copied by hand. The map is only declared: it has no pinning and nothing creates it. */
struct go_enum_list {
	enum addr_family addr_family;
	enum endpoint_flags endpoint_flags;
	enum bw_flags bw_flags;
	enum bw_const bw_const;
	enum nat_dir nat_dir;
	enum nat_state nat_state;
	enum nat_flags nat_flags;
	enum nat_default_lifetime nat_default_lifetime;
	enum flush_tables flush_tables;
	enum dev_slot_const dev_slot_const;
	enum pkt_dir pkt_dir;
	enum event_config_flags event_config_flags;
	enum policy_state policy_state;
	enum policy_rule_flags policy_rule_flags;
	enum policy_tier policy_tier;
	enum policy_port_src policy_port_src;
	struct event event; /* the ring buffer's records: events has no value type */
	struct flush_args flush_args; /* the context of bpf/flush.c's programs */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct go_enum_list);
} go_enums SEC(".maps");

char __license[] SEC("license") = "GPL";
