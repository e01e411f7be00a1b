#!/bin/sh
# Compiles bpf/maps.c into the maps' specs and their Go types. Every struct
# and enum declared in bpf/include/types.h and bpf/maps.c becomes a named Go
# type (-type), so declaring one there is all it takes.
set -e
types=$(sed -En 's/^(struct|enum) ([a-z_0-9]+)( *: *[a-z_0-9]+)? \{.*/-type \2/p' ../../bpf/include/types.h ../../bpf/maps.c)
exec go tool bpf2go -cc clang-16 -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu" -target bpfel $types Cni ../../bpf/maps.c
