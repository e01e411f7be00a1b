package nettest

import (
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// The root cause of the empty namespaces test runs left behind: closing a
// namespace while other goroutines start processes (as parallel tests
// always do: plugins, ping, ip) made a plain unmount fail with EBUSY now
// and then, and the name stayed. None may be left.
func TestCloseNetNSWhileForking(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				_ = exec.Command("true").Run()
			}
		}()
	}
	for i := 0; i < 200; i++ {
		n, err := NewNetNS()
		require.NoError(t, err)
		CloseNetNS(n)
	}
	stop.Store(true)
	wg.Wait()
	ents, err := os.ReadDir(NetNSDir)
	require.NoError(t, err)
	for _, e := range ents {
		require.False(t, strings.HasPrefix(e.Name(), NetNSPrefix()), "%s left in %s", e.Name(), NetNSDir)
	}
}
