// Package buildinfo carries the version stamped in by the Makefile.
package buildinfo

import "fmt"

// Version is the build's version, set with -ldflags "-X
// github.com/ebpf-cni/ebpf-cni/pkg/buildinfo.Version=...": make writes `git
// describe --tags --always --dirty` of the tree there (v0.2.0 on a release's
// tag, v0.2.0-5-gabc1234 five commits after it, -dirty appended with
// uncommitted changes, the abbreviated commit alone where no tag is in
// reach). A build without the flag (go build, go test) is "dev". The
// program tag is this version and the eBPF objects' digest
// (programs.TagOf); docs/deploy.md, Releases.
var Version = "dev"

// About is the line skel prints when a binary runs without CNI_COMMAND.
func About(binary string) string { return fmt.Sprintf("CNI plugin %s %s", binary, Version) }
