// Package datapath loads, pins and attaches the tc programs of ebpf-cni.
package datapath

//go:generate go tool bpf2go -cc clang-16 -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu" -target bpfel -no-global-types FromContainer ../../bpf/from_container.c
//go:generate go tool bpf2go -cc clang-16 -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu" -target bpfel -no-global-types ToContainer ../../bpf/to_container.c
//go:generate go tool bpf2go -cc clang-16 -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu" -target bpfel -no-global-types ToNetdev ../../bpf/to_netdev.c
//go:generate go tool bpf2go -cc clang-16 -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu" -target bpfel -no-global-types FromNetdev ../../bpf/from_netdev.c
//go:generate go tool bpf2go -cc clang-16 -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu" -target bpfel -no-global-types SockHostport ../../bpf/sock_hostport.c
//go:generate go tool bpf2go -cc clang-16 -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu" -target bpfel -no-global-types SockPacing ../../bpf/sock_pacing.c
