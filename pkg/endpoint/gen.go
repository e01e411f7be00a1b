package endpoint

// The programs of every pod's host veth; types come from pkg/maps.
//go:generate go tool bpf2go -cc clang-16 -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu" -target bpfel -no-global-types FromContainer ../../bpf/from_container.c
//go:generate go tool bpf2go -cc clang-16 -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu" -target bpfel -no-global-types ToContainer ../../bpf/to_container.c

// from_container built for a netkit pod's peer program (docs/datapath.md,
// "netkit pods").
//go:generate go tool bpf2go -cc clang-16 -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu" -target bpfel -no-global-types FromNetkit ../../bpf/from_netkit.c
