package programs

import (
	"errors"
	"testing"

	"github.com/cilium/ebpf/btf"
	"github.com/stretchr/testify/require"
)

// TestModuleNotLoaded: what cilium/ebpf answers for the BTF of a module
// that is not loaded is taken as "not loaded", so that ProbeConntrack
// loads nf_conntrack (a conntrack dump) before it gives up; any other
// error is not.
func TestModuleNotLoaded(t *testing.T) {
	if _, err := btf.LoadKernelSpec(); err != nil {
		t.Skipf("no kernel BTF: %v", err)
	}
	_, err := btf.LoadKernelModuleSpec("ebpf_cni_no_such_module")
	require.Error(t, err)
	require.True(t, moduleNotLoaded(err), "the error of a module that is not loaded: %v", err)
	require.True(t, moduleNotLoaded(btf.ErrNotFound))
	require.False(t, moduleNotLoaded(errors.New("reading BTF: bad magic")))
	require.False(t, moduleNotLoaded(nil))
}
