// Command ebpf-cni-agent is ebpf-cni's node agent on Kubernetes: the
// DaemonSet's init container installs the plugins and the conflist with it
// (install), and its container keeps the routes to the other nodes' pod
// ranges (run). The CNI plugin never waits for it.
package main

import (
	"os"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
)

func main() {
	os.Exit(agent.Main(os.Args[1:], os.Stdout, os.Stderr))
}
