package cli_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/cli"
)

// TestWhileAddDel: every read-only command answers with valid JSON while
// pods are being added and deleted, and gc collects no live pod.
func TestWhileAddDel(t *testing.T) {
	e := newEnv(t)
	list := e.confList("tc")
	e.addPod(list, "steady")

	var stop atomic.Bool
	var churned, problems atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				p, err := e.cni.AddPod(list, fmt.Sprintf("churn-%d-%d", w, i), nil)
				if err != nil {
					errs <- fmt.Errorf("ADD: %w", err)
					return
				}
				if err := e.cni.DelPod(list, p); err != nil {
					errs <- fmt.Errorf("DEL: %w", err)
					return
				}
				churned.Add(1)
			}
		}()
	}
	defer func() { stop.Store(true); wg.Wait() }()

	for range 8 {
		for _, c := range []string{"endpoints", "counters", "ipam", "status", "gc"} {
			r := e.cli(c, "-o", "json")
			ok := r.code == cli.ExitOK || (c == "status" && r.code == cli.ExitProblems)
			require.True(t, ok, "%s: %s", c, r)
			if r.code == cli.ExitProblems {
				problems.Add(1)
			}
			require.NotContains(t, r.stderr, "panic")
			var v any
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &v), "%s: %s", c, r)
			if c == "gc" {
				var g gcJSON
				require.NoError(t, json.Unmarshal([]byte(r.stdout), &g))
				require.Empty(t, g.Endpoints, "gc collected a live pod: %s", r.stdout)
			}
		}
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	t.Logf("%d pods added and deleted meanwhile; status saw problems %d times", churned.Load(), problems.Load())
	require.NotZero(t, churned.Load(), "no ADD/DEL ran alongside the CLI")
	eps := e.endpoints()
	require.Len(t, eps, 1)
	require.Equal(t, "steady", eps[0].ContainerID)
	require.Empty(t, eps[0].Problems, strings.Join(eps[0].Problems, "\n"))
}
