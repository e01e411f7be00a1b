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
#include "lib/nat.h"
#include "lib/hostport.h"
#include "lib/pacing.h"
#include "lib/flow.h"
#include "lib/cluster.h"

char __license[] SEC("license") = "GPL";
