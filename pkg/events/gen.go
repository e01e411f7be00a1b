package events

// The monitor's tracer of the kernel's drops (bpf/kfree_skb.c); the event
// types come from pkg/maps.
//go:generate go tool bpf2go -cc clang-16 -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu" -target bpfel -no-global-types -type pod_dev_key KfreeSkb ../../bpf/kfree_skb.c
