package cli_test

import (
	"testing"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

// TestMain removes the binaries the tests built.
func TestMain(m *testing.M) { testutil.Main(m) }
