package uplink

// The programs of the uplinks; types come from pkg/maps.
//go:generate go tool bpf2go -cc clang-16 -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu" -target bpfel -no-global-types FromNetdev ../../bpf/from_netdev.c
//go:generate go tool bpf2go -cc clang-16 -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu" -target bpfel -no-global-types ToNetdev ../../bpf/to_netdev.c
