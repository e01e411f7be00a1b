package ipam

import (
	"testing"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

// TestMain fails the run when its tests left a namespace, mount, cgroup or
// process behind.
func TestMain(m *testing.M) { testutil.Main(m) }
