package podflush

// The map iterators of a DEL's flush (bpf/flush.c); the types come from
// pkg/maps.
//go:generate go tool bpf2go -cc clang-16 -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu" -target bpfel -no-global-types Flush ../../bpf/flush.c
