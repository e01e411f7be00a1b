package cli

import (
	"flag"
	"fmt"
	"runtime"

	"github.com/ebpf-cni/ebpf-cni/pkg/buildinfo"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
)

func init() {
	register(&Command{
		Name:    "version",
		Summary: "version of this binary and the tag of the programs it loads",
		Help: `The binary's version, the tag its programs are pinned under
(<bpfRoot>/programs/<tag>: version and a digest of the eBPF object), and the
Go toolchain. Compare the tag with "ebpf-cni status" to see whether the node
runs this build's programs.

JSON: version, programTag, go, platform.`,
		Flags: func(*flag.FlagSet) func(*Context) error { return runVersion },
	})
}

type versionInfo struct {
	Version    string `json:"version"`
	ProgramTag string `json:"programTag"`
	Go         string `json:"go"`
	Platform   string `json:"platform"`
}

func runVersion(ctx *Context) error {
	v := versionInfo{buildinfo.Version, features.Tag(), runtime.Version(), runtime.GOOS + "/" + runtime.GOARCH}
	if ctx.JSON {
		return writeJSON(ctx.Stdout, v)
	}
	fmt.Fprintf(ctx.Stdout, "ebpf-cni %s\nprograms tag %s\n%s %s\n", v.Version, v.ProgramTag, v.Go, v.Platform)
	return nil
}
