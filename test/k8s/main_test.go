// Package k8s_test runs ebpf-cni on simulated Kubernetes nodes: several
// node namespaces on one L2 segment, one behind a router for the overlay,
// a world beyond the router, and rule sets shaped like kube-proxy's own in
// the nodes' netfilter. Pods are namespaces attached through the real
// plugin binaries with libcni. Nothing leaves the namespaces made here.
package k8s_test

import (
	"testing"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

// TestMain removes the plugin binaries the tests built.
func TestMain(m *testing.M) { testutil.Main(m) }
