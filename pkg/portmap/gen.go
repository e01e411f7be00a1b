package portmap

// The socket hooks of the node's cgroup; types come from pkg/maps.
//go:generate go tool bpf2go -cc clang-16 -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu" -target bpfel -no-global-types SockHostport ../../bpf/sock_hostport.c
