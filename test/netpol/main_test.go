// Package netpol_test runs the reachability matrix of the upstream
// NetworkPolicy test model (k8s.io/kubernetes test/e2e/network/netpol) on a
// simulated node: 3 namespaces x, y, z with pods a, b, c each, attached
// through the real plugin binaries with the pods' Kubernetes identity in
// CNI_ARGS, every pod serving TCP, UDP and SCTP on ports 80, 81 (and 53
// for the DNS cases), the agent's policy controller watching a fake API
// that holds the Namespaces, Pods and NetworkPolicies, and every ordered
// pair of pods probed over IPv4 and IPv6 against a table written per case.
// Nothing leaves the namespaces made here.
package netpol_test

import (
	"testing"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

// TestMain removes the plugin binaries the tests built, and fails the run
// when its tests left a namespace, mount or process behind.
func TestMain(m *testing.M) { testutil.Main(m) }
