package datapath_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

// TestParallel: 50 ADDs at once, then 50 DELs at once, leave consistent
// state: one veth, one record, one device entry and two address entries per
// pod, distinct addresses, working pods, and nothing after the DELs.
func TestParallel(t *testing.T) {
	for _, mode := range testutil.AttachModes {
		t.Run(mode, func(t *testing.T) {
			testutil.RequireMode(t, mode)
			const n = 50
			e := newEnv(t)
			list := e.confList(netOpts{attachMode: mode})
			pods := make([]*nettest.Pod, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					pods[i], errs[i] = e.cni.AddPod(list, fmt.Sprintf("par-%d", i), nil)
				}()
			}
			wg.Wait()
			for i := range n {
				require.NoError(t, errs[i], "ADD %d", i)
				p := pods[i]
				t.Cleanup(func() { _ = e.cni.DelPod(list, p) })
			}
			seen := map[string]bool{}
			for _, p := range pods {
				for _, ipc := range p.Result.IPs {
					require.False(t, seen[ipc.Address.IP.String()], "address %s handed out twice", ipc.Address.IP)
					seen[ipc.Address.IP.String()] = true
				}
			}
			require.Len(t, e.hostLinks(), n)
			require.Equal(t, n, e.records())
			a, d := e.endpointEntries()
			require.Equal(t, 2*n, a)
			require.Equal(t, n, d)
			require.Len(t, e.attachedProgramIDs(), 1)
			mustConnect(t, []*nettest.Pod{pods[0], pods[n/2], pods[n-1]})

			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[i] = e.cni.DelPod(list, pods[i])
				}()
			}
			wg.Wait()
			for i := range n {
				require.NoError(t, errs[i], "DEL %d", i)
			}
			e.requireClean()
		})
	}
}
