/* Types shared by every eBPF program of ebpf-cni and by the Go side
 * (bpf2go generates the Go mirrors with -type, never by hand). */
#ifndef EBPF_CNI_TYPES_H
#define EBPF_CNI_TYPES_H

#include <linux/types.h>

#define CNI_CONTAINER_ID_LEN 128 /* longer IDs are stored as "sha256:<hex>" */
#define CNI_IFNAME_LEN 16        /* IFNAMSIZ */
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
 * pkt_counters. Drop reasons are negative, as in the programs' return
 * paths; the counter index is their absolute value. */
enum pkt_reason {
	REASON_PASS = 0,          /* handed to the stack */
	REASON_REDIRECT = 1,      /* redirected to another device */
	REASON_DROP_MALFORMED = 2,
	REASON_DROP_SPOOF_SRC = 3,
	REASON_DROP_SPOOF_MAC = 4,
	REASON_FIB_REDIRECT = 5,  /* forwarded by bpf_fib_lookup + redirect(_neigh) */
	REASON_ARP_REPLY = 6,     /* ARP request for the gateway answered in BPF */
	REASON_DROP_NO_ENDPOINT = 7, /* program runs on a device with no endpoint entry */
	REASON_MAX = 16,
};

struct pkt_counter {
	__u64 packets;
	__u64 bytes;
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
};

#define ENDPOINT_MAX_IPS 4

/* Value of the endpoint device map, keyed by the host veth's ifindex: what
 * the pod behind that veth may send from (anti-spoofing) and who owns it. */
struct endpoint_dev {
	__u8 mac[6];       /* the pod's MAC: the only source MAC allowed */
	__u8 host_mac[6];
	__u8 n_ip4;        /* used entries of ip4 */
	__u8 n_ip6;        /* used entries of ip6 */
	__u8 pad[2];
	__u32 ip4[ENDPOINT_MAX_IPS];    /* network byte order */
	__u8 ip6[ENDPOINT_MAX_IPS][16];
	char container_id[CNI_CONTAINER_ID_LEN];
	char ifname[CNI_IFNAME_LEN];
};

/* Value of endpoint_counters, keyed by the ifindex of the device a program
 * runs on (the host veth of an endpoint): per-reason counters of that device,
 * indexed like pkt_counters. */
struct dev_counters {
	struct pkt_counter by_reason[REASON_MAX];
};

#endif
