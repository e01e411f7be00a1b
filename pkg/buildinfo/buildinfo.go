// Package buildinfo carries the version stamped in by the Makefile.
package buildinfo

import "fmt"

// Version is set with -ldflags "-X github.com/ebpf-cni/ebpf-cni/pkg/buildinfo.Version=...".
var Version = "dev"

// About is the line skel prints when a binary runs without CNI_COMMAND.
func About(binary string) string { return fmt.Sprintf("CNI plugin %s %s", binary, Version) }
