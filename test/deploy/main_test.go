// Package deploy_test checks what an operator installs: make install and
// uninstall into a DESTDIR, the conflist they write under libcni, the
// plugin's STATUS on a node without a pod range, the Kubernetes manifest
// (strict decoding, mounts, privileges), the image, and the node agent on
// two simulated nodes (network namespaces on one L2 segment) with real
// packets.
package deploy_test

import (
	"testing"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

// TestMain removes the plugin binaries the tests built.
func TestMain(m *testing.M) { testutil.Main(m) }
