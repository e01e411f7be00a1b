//go:build ignore

/* netkit's peer program: from_container.c built for a netkit pod's
 * transmit (lib/redirect.h: no bpf_redirect_peer from there). */
#define EBPF_CNI_NETKIT_PEER 1
#include "from_container.c"
