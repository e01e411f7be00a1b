/* Types shared by every eBPF program of ebpf-cni and by the Go side
 * (bpf2go generates the Go mirrors with -type, never by hand). */
#ifndef EBPF_CNI_TYPES_H
#define EBPF_CNI_TYPES_H

#include <linux/types.h>

#define CNI_CONTAINER_ID_LEN 128 /* longer IDs are stored as "sha256:<hex>" */
#define CNI_IFNAME_LEN 16        /* IFNAMSIZ */
#define CNI_POD_NAMESPACE_LEN 64 /* a Kubernetes namespace: a DNS label, at most 63 */
#define CNI_POD_NAME_LEN 254     /* a pod name: a DNS subdomain, at most 253 */
#define CNI_POD_UID_LEN 40       /* a UUID: 36 */
#define CNI_NET_NAME_LEN 128     /* longer names are stored as "sha256:<hex>" */

enum addr_family {
	ADDR_FAMILY_V4 = 4,
	ADDR_FAMILY_V6 = 6,
};

/* Key of the IPAM allocation map: one address of one network.
 * IPv4 addresses sit in the first 4 bytes of addr, the rest is zero. */
struct ipam_key {
	__u32 net_id;   /* FNV-1a of the network name, see ipam_nets */
	__u8 family;    /* enum addr_family */
	__u8 pad[3];
	__u8 addr[16];  /* network byte order */
};

/* Value of the IPAM allocation map: who holds the address. */
struct ipam_owner {
	char container_id[CNI_CONTAINER_ID_LEN];
	char ifname[CNI_IFNAME_LEN];
	__u32 range_set;  /* index of the range set the address came from */
	__u32 flags;
	__u64 alloc_time; /* unix seconds */
};

/* Key of the round-robin cursor map: last address handed out per range set. */
struct ipam_cursor_key {
	__u32 net_id;
	__u32 range_set;
};

struct ipam_cursor {
	__u8 family;
	__u8 pad[7];
	__u8 addr[16];
};

/* Value of the network registry: which name a net_id stands for, so that a
 * hash clash between two network names is detected instead of merged. */
struct ipam_net {
	char name[CNI_NET_NAME_LEN];
};

/* Reasons a program drops or passes a packet; counted per CPU in
 * node_counters. Drop reasons are negative, as in the programs' return
 * paths (DROP() of lib/verdict.h); the counter index is their absolute
 * value (and the direction the second). A drop reason's name starts with
 * REASON_DROP_.
 *
 * The quoted text that opens each value's comment is what `ebpf-cni
 * counters` shows for it (pkg/maps/reasons_gen.go is generated from it;
 * its JSON key is the name, lower case, without REASON_): every value but
 * REASON_MAX needs one. */
enum pkt_reason {
	REASON_PASS = 0,          /* "pass to stack": handed to the stack */
	REASON_REDIRECT = 1,      /* "redirect_peer to pod": redirected to another device */
	REASON_DROP_MALFORMED = 2, /* "drop: malformed" */
	REASON_DROP_SPOOF_SRC = 3, /* "drop: spoofed source IP" */
	REASON_DROP_SPOOF_MAC = 4, /* "drop: spoofed source MAC" */
	REASON_FIB_REDIRECT = 5,  /* "fib_lookup + redirect": forwarded by bpf_fib_lookup + redirect(_neigh) */
	REASON_ARP_REPLY = 6,     /* "ARP answered in BPF": ARP request for the gateway answered in BPF */
	REASON_DROP_NO_ENDPOINT = 7, /* "drop: no endpoint": program runs on a device with no endpoint entry */
	REASON_SNAT = 8,             /* "masquerade: source translated": pod traffic leaving an uplink */
	REASON_REV_SNAT = 9,         /* "masquerade: reply translated to pod": reply (or ICMP error)
				      * translated back, redirected to the pod */
	REASON_DROP_NAT_NO_PORT = 10, /* "drop: no free masquerade port": none free in the masquerade range */
	REASON_DROP_NAT_UNSUPPORTED = 11, /* "drop: cannot masquerade": masqueraded traffic we cannot
					   * translate (protocol, fragment) */
	REASON_DROP_NAT_NO_ADDR = 12, /* "drop: uplink has no address": none to masquerade with */
	REASON_DROP_BW_EGRESS = 13,   /* "drop: over egress rate": over the pod's egress rate */
	REASON_DROP_BW_INGRESS = 14,  /* "drop: over ingress rate": over the pod's ingress rate */
	REASON_DNAT = 15,             /* "hostPort: translated to pod": destination translated to the pod */
	REASON_REV_DNAT = 16,         /* "hostPort: reply translated back": the pod's reply translated back */
	REASON_STACK_REPLY = 17,      /* "reply to stack-NATed flow, to stack": reply to a flow the stack
				       * delivered (its NAT), handed to the stack */
	REASON_FROM_STACK = 18,       /* "delivered to pod by the stack": delivered to the pod by the
				       * node's stack */
	REASON_TO_QDISC = 19,         /* "to another plugin's ingress qdisc": a pod's packet handed to
				       * another plugin's ingress qdisc (its filters, then the stack)
				       * instead of redirected (lib/qdisc.h) */
	REASON_VIA_QDISC = 20,        /* "delivered through the root qdisc": delivered to the pod through
				       * the host veth's root qdisc (another plugin's shaping), not
				       * straight into its netns */
	REASON_FLOW_NEW = 21,         /* "new flow to the stack (netfilter)": a pod's new flow handed to
				       * the stack, so that netfilter (kube-proxy) sees its first packet
				       * (lib/flow.h) */
	REASON_FLOW_STACK = 22,       /* "to a pod through the stack (netfilter)": a packet for a pod of a
				       * flow netfilter translated, handed to the stack to be translated
				       * back */
	REASON_ROUTED_IN = 23,        /* "routed in straight to a pod": from an uplink straight into a pod
				       * (routed to its address) */
	REASON_TUNNEL_ENCAP = 24,     /* "into the overlay": a pod's packet to another node's pod */
	REASON_TUNNEL_DECAP = 25,     /* "from the overlay to a pod": from the overlay straight into a pod */
	REASON_DROP_TUNNEL = 26,      /* "drop: overlay unavailable": the overlay's device is gone or
				       * refused the tunnel key */
	REASON_DROP_POLICY_INGRESS = 27, /* "drop: denied by ingress policy": no NetworkPolicy lets this
					  * peer reach the pod on this port (lib/policy.h) */
	REASON_DROP_POLICY_EGRESS = 28,  /* "drop: denied by egress policy": no NetworkPolicy lets the pod
					  * reach this peer on this port (lib/policy.h) */
	REASON_TUNNEL_UPLINK = 29,       /* "into the overlay straight out of the uplink": a pod's packet to
					  * another node's pod, encapsulated by the program and sent out of
					  * the uplink (no VXLAN device) */
	REASON_MAX = 32,
};

/* Which way a packet goes, seen from the pod (or, on an uplink, from the
 * node): each program runs on one hook and passes its own to verdict()
 * (lib/verdict.h), which counts and reports the packet under it. */
enum pkt_dir {
	PKT_DIR_EGRESS = 0,  /* leaving: from_container, to_netdev, to_tunnel */
	PKT_DIR_INGRESS = 1, /* arriving: to_container, from_netdev, from_tunnel */
	PKT_DIR_MAX = 2,
};

struct pkt_counter {
	__u64 packets;
	__u64 bytes;
};

/* The live event stream (lib/events.h, `ebpf-cni monitor`): what the
 * datapath reports of a packet while a reader holds the lease. */
enum event_type : __u8 {
	EVENT_DROP = 1,        /* a program dropped the packet: reason is an enum pkt_reason */
	EVENT_FLOW_START = 2,  /* a sampled flow's first packet: TCP SYN without ACK, or a new UDP flow
				* handed to netfilter (REASON_FLOW_NEW) */
	EVENT_FLOW_END = 3,    /* a sampled flow's TCP FIN or RST */
	EVENT_KERNEL_DROP = 4, /* the kernel freed a pod's packet as a drop (the monitor's kfree_skb
				* tracer): reason is the kernel's enum skb_drop_reason */
};

enum event_flags : __u8 {
	EVENT_F_ARP = 1,  /* an ARP packet: saddr/daddr are its sender and target IPv4 addresses */
	EVENT_F_FRAG = 2, /* an IPv4 fragment: no ports */
};

/* One event of the ring buffer events. Addresses in the first 4 bytes for
 * IPv4; ports in network byte order; fields the packet did not hold are 0. */
struct event {
	__u64 time;     /* bpf_ktime_get_ns (CLOCK_MONOTONIC) */
	__u32 ifindex;  /* the device the program runs on (a pod's host veth, an uplink) */
	__u32 len;      /* skb->len */
	__u16 reason;   /* enum pkt_reason, or the kernel's skb_drop_reason (EVENT_KERNEL_DROP) */
	enum event_type type;
	__u8 dir;       /* enum pkt_dir of the program */
	__u8 family;    /* enum addr_family; 0: neither IP nor ARP */
	__u8 proto;     /* IPPROTO_* */
	enum event_flags flags;
	__u8 tcp_flags; /* TCP: the flags byte (FIN 1, SYN 2, RST 4, ACK 16) */
	__be16 sport;
	__be16 dport;
	__u8 mac[6];    /* the Ethernet source */
	__u8 pad[2];
	__u8 saddr[16];
	__u8 daddr[16];
	__u32 pad2;
};

enum event_config_flags {
	EVENT_CF_FLOWS = 1, /* report sampled flow starts and ends (`monitor --flows`) */
};

/* Entry 0 of events_config: written by the reader, read by every program. */
struct event_config {
	__u64 lease;        /* bpf_ktime_get_ns until which the stream is on; 0: off. The reader
			     * renews it every second; a program that finds it expired sets it to 0 */
	__u64 ns_per_event; /* the rate limit: one event per CPU every ns_per_event */
	__u64 burst;        /* ns of credit a CPU may save up: burst / ns_per_event events at once */
	__u32 flags;        /* enum event_config_flags */
	__u32 flow_sample;  /* a flow is reported when its hash mod flow_sample is 0; 0 or 1: every flow */
	__u32 reader_pid;   /* the process that holds the lease (for its refusal message) */
	__u32 pad;
};

/* Value of events_stats (per CPU): the rate limiter and what it cost. */
struct event_stats {
	__u64 tat;                      /* when this CPU's bucket is full again (GCRA, as bw_bucket) */
	__u64 suppressed[REASON_MAX];   /* drops by reason the rate limit kept from the stream */
	__u64 lost[REASON_MAX];         /* drops by reason the ring buffer had no room for */
	__u64 flow_suppressed;
	__u64 flow_lost;
	__u64 kernel_suppressed;
	__u64 kernel_lost;
};

/* Key of the endpoint map: one address of a pod on this node.
 * IPv4 addresses sit in the first 4 bytes of addr, the rest is zero. */
struct endpoint_key {
	__u8 family;   /* enum addr_family */
	__u8 pad[3];
	__u8 addr[16]; /* network byte order */
};

/* Value of the endpoint map: where a pod address lives. */
struct endpoint_info {
	__u32 ifindex;     /* host end of the pod's veth */
	__u8 mac[6];       /* the pod's MAC */
	__u8 host_mac[6];  /* the host end's MAC: the pod's gateway MAC */
	__u32 net_id;      /* FNV-1a of the network name: its masquerade settings */
	__u32 flags;       /* enum endpoint_flags */
};

/* What an endpoint has configured beyond forwarding, so the programs skip
 * the lookups of features a pod does not use. */
enum endpoint_flags {
	EP_F_HOSTPORT = 1,   /* the pod has port mappings: its replies may need reverse DNAT */
	EP_F_BW_EGRESS = 2,  /* the pod's egress is rate limited */
	EP_F_BW_INGRESS = 4, /* the pod's ingress is rate limited */
	EP_F_STACK = 8,      /* set by to_container: the stack delivered a flow to the pod (endpoint_dev only) */
	EP_F_QDISC = 16,     /* set by from_container: the host veth's root qdisc queues (another plugin's
			      * shaping): deliveries go through it (endpoint_info; endpoint_dev holds
			      * from_container's copy of what it last set, lib/qdisc.h) */
	EP_F_CLSACT = 32,    /* the programs are cls_bpf filters (attachMode tc): the host veth's
			      * clsact qdisc is ours, not another plugin's */
};

#define ENDPOINT_MAX_IPS 4

/* Value of the endpoint device map, keyed by the host veth's ifindex: what
 * the pod behind that veth may send from (anti-spoofing) and who owns it. */
struct endpoint_dev {
	__u8 mac[6];       /* the pod's MAC: the only source MAC allowed */
	__u8 host_mac[6];
	__u8 n_ip4;        /* used entries of ip4 */
	__u8 n_ip6;        /* used entries of ip6 */
	__u16 flags;       /* enum endpoint_flags, as in endpoint_info */
	__u32 ip4[ENDPOINT_MAX_IPS];    /* network byte order */
	__u8 ip6[ENDPOINT_MAX_IPS][16];
	char container_id[CNI_CONTAINER_ID_LEN];
	char ifname[CNI_IFNAME_LEN];
};

/* Value of node_info (lib/node.h): what the node is, for the plugin and
 * the operator CLI. */
struct node_facts {
	/* SO_NETNS_COOKIE of the network namespace every ADD made its host
	 * veth in: the node's. A decision that destroys an endpoint whose host
	 * veth is not found (its pod gone without DEL) is taken only there. */
	__u64 netns_cookie;
};

/* Value of endpoint_pods (lib/pods.h), keyed like endpoint_devs: the pod's
 * Kubernetes identity as the runtime passed it in CNI_ARGS (K8S_POD_*),
 * NUL-terminated, cut at the array's size. */
struct endpoint_pod {
	char namespace[CNI_POD_NAMESPACE_LEN];
	char name[CNI_POD_NAME_LEN];
	char uid[CNI_POD_UID_LEN];
};

/* Value of node_counters (indexed by enum pkt_reason): one reason's
 * counts, by enum pkt_dir. */
struct dir_counters {
	struct pkt_counter by_dir[PKT_DIR_MAX];
};

/* Value of device_counters, keyed by the ifindex of the device a program
 * runs on (the host veth of an endpoint, or an uplink), and of
 * slot_counters, indexed by the device's slot (lib/counters.h): that
 * device's counters, indexed like node_counters. */
struct dev_counters {
	struct dir_counters by_reason[REASON_MAX];
};

/* The slots of per-device counters (lib/counters.h): a device's slots are
 * the DEV_SLOT_PROBES ones from its ifindex modulo DEV_SLOTS on. */
enum dev_slot_const {
	DEV_SLOTS = 512,      /* a power of two: 512 KiB of counters per CPU */
	DEV_SLOT_PROBES = 4,
};

/* Bandwidth: one policer per endpoint and direction, keyed in bw_buckets by
 * the host veth's ifindex. A GCRA (virtual scheduling) token bucket: the
 * whole state is one 64-bit "theoretical arrival time", updated with a
 * compare-and-swap, so every CPU may police the same pod at once without a
 * lock (bpf/lib/bandwidth.h). */
struct bw_bucket {
	__u64 tat;          /* bpf_ktime_get_ns when the bucket would be full again; 0: full */
	__u64 ns_per_byte;  /* cost of one byte in ns, fixed point << BW_NS_SHIFT; 0: no limit */
	__u64 tau;          /* burst tolerance in ns: how far tat may run ahead of now */
	__u64 rate;         /* bits per second as configured (for dumps and CHECK) */
	__u64 burst;        /* bits as configured (for dumps and CHECK) */
	__u64 drops;        /* packets dropped (atomic add) */
	__u64 drop_bytes;   /* their bytes as charged */
	__u64 flags;        /* enum bw_flags */
	__u64 recovery;     /* ns of credit a stalled flow keeps after drops (see bandwidth.h) */
	__u64 last_drop;    /* bpf_ktime_get_ns of the last drop; written without atomics: a hint */
};

enum bw_flags {
	BW_F_EDT = 1, /* the host veth has an fq qdisc: stack traffic is paced (skb->tstamp), not dropped */
};

/* Constants of the buckets that the Go side computes with: an enum, not a
 * #define, so that bpf2go generates them (pkg/maps) and nothing is copied. */
enum bw_const {
	/* ns_per_byte is fixed point with this many fraction bits: exact to
	 * 0.01% up to 1 Tbit/s, and bytes * ns_per_byte fits 64 bits down to
	 * 1 kbit/s for a 64 KB packet. */
	BW_NS_SHIFT = 20,
};

struct bw_state {
	struct bw_bucket egress;  /* leaving the pod */
	struct bw_bucket ingress; /* delivered to the pod */
};

/* Masquerade: connection tracking and source NAT for pod traffic leaving
 * through an uplink. One LRU table holds both directions of every flow. */
enum nat_dir {
	NAT_DIR_OUT = 0, /* pod -> remote, keyed by the pod's tuple */
	NAT_DIR_IN = 1,  /* remote -> node, keyed by the translated tuple */
	NAT_DIR_DNAT = 2,  /* hostPort: the pod's replies, keyed by the pod's tuple */
};

enum nat_state {
	NAT_STATE_SYN_SENT = 1,    /* TCP: the pod's SYN went out, no answer yet */
	NAT_STATE_ESTABLISHED = 2, /* TCP: both sides spoke */
	NAT_STATE_CLOSING = 3,     /* TCP: FIN or RST seen */
	NAT_STATE_OPEN = 4,        /* UDP, ICMP echo */
};

/* Default idle lifetimes of NAT entries, in seconds: what the programs use
 * while nat_timeouts holds none, and what pkg/nat starts from (an enum so
 * that bpf2go generates them). */
enum nat_default_lifetime {
	NAT_DEFAULT_TCP_SYN = 60,
	NAT_DEFAULT_TCP_ESTABLISHED = 21600,
	NAT_DEFAULT_TCP_CLOSING = 10,
	NAT_DEFAULT_UDP = 60,
	NAT_DEFAULT_ICMP = 30,
};

enum nat_flags {
	NAT_F_KEPT = 1,    /* the pod's own port or identifier was kept */
	NAT_F_REPLIED = 2, /* a reply came back */
	NAT_F_HAIRPIN = 4, /* DNAT: the client is the pod itself, its source was translated too */
	NAT_F_FAST = 8,    /* OUT, TCP: from_container translated its last packet: on the fast path (lib/flow.h) */
	NAT_F_BYPASS = 16, /* OUT, TCP: set up in BPF at its SYN (lib/xlat.h): fast for its life, its verdict
			    * kept here instead of in flows (lib/flow.h) */
};

/* A DEL's flush of its pod's entries from the big LRU tables (nat, flows):
 * what it asks of bpf/flush.c, whose programs it runs itself. */
enum flush_tables {
	FLUSH_NAT_OUT = 1 << NAT_DIR_OUT,   /* its masqueraded flows */
	FLUSH_NAT_IN = 1 << NAT_DIR_IN,     /* their reply entries */
	FLUSH_NAT_DNAT = 1 << NAT_DIR_DNAT, /* the flows to its hostPorts */
	FLUSH_FLOWS = 1 << 3,               /* its entries of flows */
};

#define FLUSH_MAX_PODS 8 /* addresses in one struct flush_args */

/* One address whose entries go, and the tables they go from. */
struct flush_pod {
	__u32 tables;  /* enum flush_tables */
	__u8 family;   /* enum addr_family */
	__u8 pad[3];
	__u8 addr[16]; /* network byte order; IPv4 in the first 4 bytes */
};

/* The context of a run of flush_nat or flush_flows. */
struct flush_args {
	__u32 n; /* pods used */
	__u32 pad;
	struct flush_pod pods[FLUSH_MAX_PODS];
};

/* Addresses in the first 4 bytes for IPv4; ports in network byte order.
 * ICMP echo: the identifier is sport of an OUT key and dport of an IN key. */
struct nat_key {
	__u8 family;   /* enum addr_family */
	__u8 proto;    /* IPPROTO_TCP, IPPROTO_UDP, IPPROTO_ICMP, IPPROTO_ICMPV6 */
	__u8 dir;      /* enum nat_dir */
	__u8 pad;
	__be16 sport;
	__be16 dport;
	__u8 saddr[16];
	__u8 daddr[16];
};

/* OUT: the translated source; IN: the pod's address and port; DNAT: the
 * address and port the client asked for (the node's, the hostPort). The OUT
 * entry holds the flow's state and clock; an IN entry is only valid while
 * its OUT entry is. */
struct nat_entry {
	__u8 addr[16];
	__be16 port;
	__u8 state;    /* enum nat_state (OUT) */
	__u8 flags;    /* enum nat_flags (OUT) */
	__u32 net_id;
	__u64 created;   /* bpf_ktime_get_ns */
	__u64 last_seen; /* bpf_ktime_get_ns */
};

/* Node-wide lifetimes of NAT entries, in seconds (entry 0 of nat_timeouts). */
struct nat_lifetimes {
	__u32 tcp_syn;
	__u32 tcp_established;
	__u32 tcp_closing;
	__u32 udp;
	__u32 icmp;
	__u32 pad;
};

/* Enums with a fixed underlying type (a clang extension in C) are one byte
 * in the structs, and bpf2go finds them in BTF through those fields.
 *
 * Flow tracking: what the datapath knows of a pod's flows that netfilter
 * (kube-proxy's Services, a chained portmap) may translate. A flow goes
 * through the node's stack in both directions exactly when netfilter
 * translated it (or the stack alone can deliver it); every other flow keeps
 * the fast path both ways (lib/flow.h). */
enum flow_verdict : __u8 {
	FLOW_PENDING = 1, /* to the stack until netfilter is seen to let a packet of it through */
	FLOW_FAST = 2,    /* netfilter leaves it alone: redirected both ways */
	FLOW_STACK = 3,   /* netfilter translated it, or the stack delivered it: the stack both ways */
};

enum flow_flags : __u8 {
	FLOW_F_INBOUND = 1,   /* opened toward the pod: its replies are never masqueraded */
	FLOW_F_UNTRACKED = 2, /* left the node through netfilter without a conntrack entry: conntrack
			       * does not track it, nothing to ask it again (lib/flow.h) */
	FLOW_F_BYPASS = 4,    /* set up in BPF (lib/xlat.h): the node agent's lease was valid and the
			       * destination not one netfilter may translate; its first packet
			       * never met netfilter, conntrack has no entry to ask */
};

/* Destinations the node's netfilter may translate (lib/xlat.h): kube-proxy's
 * Service ranges, ClusterIPs, externalIPs, load-balancer IPs and the nodes'
 * addresses (NodePorts), written by the node agent. Trusted only while the
 * lease in xlat_lease runs. prefixlen counts the 32 bits of family and pad. */
struct xlat_key {
	__u32 prefixlen;
	__u8 family; /* enum addr_family */
	__u8 pad[3];
	__u8 addr[16];
};

/* What kube-proxy has at a destination of xlat_dsts (a prefix may be
 * several at once): for people, the datapath only asks whether it is there. */
enum xlat_kind : __u8 {
	XLAT_SERVICE_RANGE = 1,  /* a Service range (kube-apiserver --service-cluster-ip-range) */
	XLAT_CLUSTER_IP = 2,     /* a Service's spec.clusterIPs */
	XLAT_EXTERNAL_IP = 4,    /* a Service's spec.externalIPs */
	XLAT_LOAD_BALANCER = 8,  /* a Service's status.loadBalancer.ingress IPs */
	XLAT_NODE = 16,          /* a Node's address (NodePorts) */
};

struct xlat_dst {
	enum xlat_kind kinds;
	__u8 pad[7];
};

/* Entry 0 of xlat_lease: the node agent's promise that xlat_dsts holds
 * every destination netfilter may translate, until expires. All zero (never
 * written, or an agent that wrote none): no promise. */
struct xlat_term {
	__u64 expires;    /* bpf_ktime_get_ns (CLOCK_MONOTONIC) until which xlat_dsts is trusted */
	__u64 renewed;    /* when the agent last renewed it, same clock */
	__u64 generation; /* counts the agent's writes of the set */
	__u32 entries;    /* prefixes in xlat_dsts at the last write */
	__u32 pad;
};

/* Key of flows: a flow as the pod sends it, the pod's address and port as
 * the source. Addresses in the first 4 bytes for IPv4; ports in network
 * byte order. */
struct flow_key {
	__u8 family; /* enum addr_family */
	__u8 proto;  /* IPPROTO_TCP, IPPROTO_UDP */
	__u8 pad[2];
	__be16 sport; /* the pod's port */
	__be16 dport; /* the remote's port */
	__u8 saddr[16]; /* the pod */
	__u8 daddr[16]; /* the remote */
};

struct flow_entry {
	enum flow_verdict verdict;
	enum flow_flags flags;
	__u8 pending;    /* packets sent to the stack while the verdict was pending (saturates at 255) */
	__u8 pad[5];
	__u64 last_seen; /* bpf_ktime_get_ns, refreshed at most once a second */
};

/* Cluster routing: the cluster's pod ranges (clusterCIDRs: never
 * masqueraded, never looked up in flows) and the pod ranges of other nodes
 * reached through the overlay, in one LPM trie so that one lookup answers
 * both. prefixlen counts the 32 bits of family and pad. */
struct cluster_key {
	__u32 prefixlen;
	__u8 family;   /* enum addr_family */
	__u8 pad[3];
	__u8 addr[16];
};

enum cluster_flags : __u8 {
	CLUSTER_F_RANGE = 1,  /* in clusterCIDRs (written by ADD) */
	CLUSTER_F_TUNNEL = 2, /* another node's pod range behind the overlay (written by the
			       * node agent or `ebpf-cni tunnels`): node is its underlay address */
};

struct cluster_route {
	enum cluster_flags flags;
	__u8 node_family; /* enum addr_family of node */
	__u8 pad[2];
	__u8 node[16];    /* the remote node's underlay address (CLUSTER_F_TUNNEL) */
};

/* How the overlay's packets look on the wire (entry 0 of overlay_config):
 * from_netdev recognises them by it, to decapsulate them itself. A map of
 * its own, since cluster_config's layout is pinned on running nodes: a node
 * upgraded from a build without it finds it empty until the overlay is
 * set up again (its next ADD), and decapsulation stays the device's. */
struct overlay_settings {
	__be16 port; /* the VXLAN device's UDP port, network byte order; 0: no overlay */
	__u8 pad[2];
	__be32 vni_word; /* the second word of the VXLAN header: the VNI << 8, network byte order */
};

/* Node-wide overlay settings (entry 0 of cluster_config). */
struct cluster_settings {
	__u32 vxlan_ifindex; /* the flow-based VXLAN device; 0: no overlay */
	__u32 vni;           /* VXLAN network identifier of the cluster */
};

/* Key of masq_nets: one address family of one network with ipMasq. */
struct masq_net_key {
	__u32 net_id;
	__u8 family;
	__u8 pad[3];
};

struct masq_net {
	__u8 addr[16];   /* masqueradeIP; all zero: the uplink's primary address */
	__u16 port_min;  /* host byte order: the range a clashing port moves to */
	__u16 port_max;
	__u32 flags;
};

/* LPM key of masq_skip: destinations a network never masquerades to
 * (nonMasqueradeCIDRs). prefixlen counts the 40 bits of net_id and family. */
struct masq_skip_key {
	__u32 prefixlen;
	__u32 net_id;
	__u8 family;
	__u8 addr[16];
	__u8 pad[3];
};

/* Value of uplinks, keyed by ifindex: the addresses to masquerade with. */
struct uplink_info {
	__u8 ip4[4];
	__u8 ip6[16];
	__u8 has4;
	__u8 has6;
	__u8 pad[2];
};

/* hostPort: one published port of the node, all the pods that hold it. */
#define HOSTPORT_MAX_IPS 4

struct hostport_key {
	__u8 family;   /* enum addr_family */
	__u8 proto;    /* IPPROTO_TCP, IPPROTO_UDP, IPPROTO_SCTP */
	__be16 port;   /* the hostPort */
};

/* Where a published port leads: a pod's address and its containerPort. */
struct hostport_target {
	__u8 addr[16];
	__be16 port;
	__u8 pad[2];
};

/* Either one target for every node address (any = 1, no hostIP), or up to
 * HOSTPORT_MAX_IPS targets each bound to one hostIP: a port published on
 * every address clashes with any other holder of that port. */
struct hostport_entry {
	__u8 any;
	__u8 n;        /* used entries of host_ip and to */
	__u8 pad[2];
	__u8 host_ip[HOSTPORT_MAX_IPS][16];
	struct hostport_target to[HOSTPORT_MAX_IPS];
};

/* Node-wide settings of hostPort (entry 0 of hostport_config). */
struct hostport_settings {
	__u64 netns_cookie; /* the node's netns: the socket hooks leave every other alone */
	__u32 active;       /* some pod of the node has port mappings */
	__u32 pad;
};

/* Key of sock_revnat: a socket of the node that the socket hooks pointed at
 * a pod, and the pod's address and port it talks to. */
struct sock_rev_key {
	__u64 cookie;  /* bpf_get_socket_cookie */
	__u8 family;
	__u8 proto;
	__be16 port;
	__u8 addr[16];
};

/* What the socket asked for: the node's address (or loopback) and hostPort. */
struct sock_rev {
	__u8 addr[16];
	__be16 port;
	__u8 pad[6];
};

/* NetworkPolicy (lib/policy.h). The node agent compiles the policies that
 * select each endpoint of this node into policy_rules; the programs decide
 * a flow on its first packet and remember the decision in policy_flows. */

/* Whether a direction of an endpoint is isolated, and how. */
enum policy_state : __u8 {
	POLICY_OPEN = 0,    /* no policy selects the pod for this direction: everything allowed */
	POLICY_CLOSED = 1,  /* isolated, rules not written yet (ADD in a namespace that has policies,
			     * before the agent saw the pod): everything denied */
	POLICY_ENFORCE = 2, /* isolated: what policy_rules allow, nothing else */
};

/* Value of policy_endpoints, keyed by the host veth's ifindex (as
 * endpoint_devs). No entry: open both ways. The generations change with
 * the rules of their direction: a flow decided under another one is
 * decided again. */
struct policy_endpoint {
	__u8 ingress; /* enum policy_state */
	__u8 egress;  /* enum policy_state */
	__u8 pad[2];
	__u32 ingress_gen;
	__u32 egress_gen;
};

/* Key of policy_rules (an LPM trie): an endpoint, a direction and a peer
 * prefix. prefixlen counts the 64 bits of ifindex, dir, family and pad,
 * then the address bits: a /n peer has prefixlen 64 + n. */
struct policy_key {
	__u32 prefixlen;
	__u32 ifindex;   /* the endpoint's host veth */
	__u8 dir;        /* enum pkt_dir: INGRESS, peers that may reach the pod; EGRESS, peers it may reach */
	__u8 family;     /* enum addr_family of the peer */
	__u8 pad[2];
	__u8 addr[16];   /* the peer, network byte order; IPv4 in the first 4 bytes */
};

#define POLICY_MAX_PORTS 16
#define POLICY_MAX_SOURCES 4

/* Bits of policy_port.src. */
enum policy_port_src : __u8 {
	POLICY_PORT_SRC = 0x7f,    /* for people: 1 + the index in sources of the policy that decided the range
				    * (0: the sources as a whole) */
	POLICY_PORT_DENIED = 0x80, /* the range is denied (a ClusterNetworkPolicy's Deny, or what the
				    * NetworkPolicies that isolate the pod do not allow) */
};

/* One port range of a rule: allowed, or denied with POLICY_PORT_DENIED. */
struct policy_port {
	__u16 first; /* host byte order */
	__u16 last;  /* inclusive; == first for a single port */
	__u8 proto;  /* IPPROTO_TCP, IPPROTO_UDP, IPPROTO_SCTP */
	__u8 src;    /* enum policy_port_src */
};

enum policy_rule_flags : __u8 {
	POLICY_F_ALL_PORTS = 1,    /* a rule without ports: every protocol and port (ICMP too) */
	POLICY_F_EXCEPT_PORTS = 2, /* what ports does not list is allowed, every other protocol (ICMP too)
				    * with it; without it, denied (a ClusterNetworkPolicy's Deny in what is
				    * otherwise allowed) */
};

/* Value of policy_rules: what the peers of the longest matching prefix may
 * use, every rule that covers them merged in (the agent merges them: one
 * lookup decides). POLICY_F_ALL_PORTS: everything. Else each port range
 * listed is allowed, or denied with POLICY_PORT_DENIED; what no range
 * lists (protocols without ports among it) is allowed with
 * POLICY_F_EXCEPT_PORTS, denied without. */
struct policy_rule {
	__u8 flags;     /* enum policy_rule_flags */
	__u8 n_ports;   /* used entries of ports */
	__u8 n_sources; /* used entries of sources */
	__u8 rest;      /* for people: 1 + the index in sources of the policy that decided what ports does not list; 0: none */
	__u32 sources[POLICY_MAX_SOURCES]; /* policy_sources ids of the policies that decided it (the first ones) */
	struct policy_port ports[POLICY_MAX_PORTS];
};

/* The tier of a policy: the order in which they decide a flow. */
enum policy_tier : __u8 {
	POLICY_TIER_NETWORK_POLICY = 0, /* a NetworkPolicy (networking.k8s.io/v1) */
	POLICY_TIER_ADMIN = 1,          /* a ClusterNetworkPolicy of tier Admin: before NetworkPolicies */
	POLICY_TIER_BASELINE = 2,       /* a ClusterNetworkPolicy of tier Baseline: after them */
};

/* Value of policy_sources: a policy's tier, priority, namespace and name,
 * for people (the CLI); keyed by its id, FNV-1a of "namespace/name" (a
 * ClusterNetworkPolicy's namespace is empty). */
struct policy_source {
	__u8 tier;      /* enum policy_tier */
	__u8 pad;
	__u16 priority; /* a ClusterNetworkPolicy's spec.priority (0-1000): lower decides first */
	char namespace[CNI_POD_NAMESPACE_LEN];
	char name[CNI_POD_NAME_LEN];
};

/* Key of policy_namespaces: a namespace that has policies. */
struct policy_ns_key {
	char namespace[CNI_POD_NAMESPACE_LEN];
};

/* Value of policy_namespaces: the directions its policies isolate; ADD
 * starts a pod of it with those closed until the agent wrote its rules. */
struct policy_ns {
	__u8 ingress; /* 1: some policy of the namespace has policyType Ingress */
	__u8 egress;  /* 1: some policy of the namespace has policyType Egress */
	__u8 pad[2];
};

/* Value of policy_config[0]. */
struct policy_settings {
	__u32 active; /* 1: some endpoint may have an entry in policy_endpoints; 0: skip every lookup */
	__u32 pad;
};

/* Key of policy_flows: a packet's tuple as it travels (addresses in the
 * first 4 bytes for IPv4; ports in network byte order; an ICMP echo's
 * identifier in both). */
struct policy_flow_key {
	__u8 family; /* enum addr_family */
	__u8 proto;
	__u8 pad[2];
	__be16 sport;
	__be16 dport;
	__u8 saddr[16];
	__u8 daddr[16];
};

/* Value of policy_flows: an allowed flow, one entry per direction. */
struct policy_flow {
	__u32 src_ifindex; /* the endpoint that opened the flow (0: not a pod of this node) */
	__u32 dst_ifindex; /* the endpoint it opened it to (0: none) */
	__u32 egress_gen;  /* src's egress generation when decided */
	__u32 ingress_gen; /* dst's ingress generation when decided */
	__u8 reply;        /* 1: this key is the reply direction */
	__u8 pad[7];
};

/* Key of policy_drops (per CPU): denied packets by endpoint and direction. */
struct policy_drop_key {
	__u32 ifindex;
	__u32 dir; /* enum pkt_dir */
};

#endif
