// Package maps holds the eBPF maps shared by every binary and program: their
// specs (from bpf/maps.c) and the Go types of their keys and values, generated
// by bpf2go from bpf/include/types.h.
package maps

//go:generate go tool bpf2go -cc clang-16 -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu" -target bpfel -type ipam_key -type ipam_owner -type ipam_cursor_key -type ipam_cursor -type ipam_net -type pkt_counter -type pkt_reason -type dev_counters -type endpoint_key -type endpoint_info -type endpoint_dev -type nat_key -type nat_entry -type nat_lifetimes -type masq_net_key -type masq_net -type masq_skip_key -type uplink_info -type hostport_key -type hostport_target -type hostport_entry -type hostport_settings -type sock_rev_key -type sock_rev -type bw_bucket -type bw_state -type flow_key -type flow_entry -type flow_verdict -type flow_flags -type cluster_key -type cluster_route -type cluster_flags -type cluster_settings Cni ../../bpf/maps.c
