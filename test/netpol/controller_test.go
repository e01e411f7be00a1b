package netpol_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/internal/nodetest"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
)

// controller is the agent's policy controller running on the cluster's
// fake API and node maps.
type controller struct {
	c      *agent.PolicyController
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// startController starts a policy controller and waits until it has
// synced (its first full write done); it stops at cleanup unless stopped
// before.
func (cl *cluster) startController(t testing.TB) *controller {
	t.Helper()
	c := agent.NewPolicyController(cl.client, agent.PolicyConfig{Node: nodetest.Handle(t, cl.node.BPFRoot, cl.node.StateDir), ClusterPolicies: cl.cnps,
		Logger: slog.New(slog.NewTextHandler(logWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	ctx, cancel := context.WithCancel(context.Background())
	ctl := &controller{c: c, cancel: cancel, done: make(chan error, 1)}
	go func() { ctl.done <- c.Run(ctx) }()
	t.Cleanup(func() { ctl.stop(t) })
	cl.ctl = ctl
	deadline := time.Now().Add(5 * time.Second)
	for !c.Synced() {
		select {
		case err := <-ctl.done:
			t.Fatalf("the policy controller ended before it synced: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the policy controller has not synced in 5 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return ctl
}

// stop cancels the controller's context and waits for Run to return.
func (ctl *controller) stop(t testing.TB) {
	t.Helper()
	ctl.once.Do(func() {
		ctl.cancel()
		select {
		case err := <-ctl.done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("the policy controller's Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("the policy controller's Run has not returned 10 s after its context ended")
		}
	})
}

// writes counts the controller's writes of the maps so far.
func (ctl *controller) writes() int { return len(ctl.c.Latencies()) }

// change makes an API change and waits until the controller has written
// the maps since, so that no probe runs before the agent acted on it (a
// case whose matrix is the same as without policies would pass anyway).
// The agent may see a burst of changes in more than one write: the
// matrix's own retries cover the rest.
func (cl *cluster) change(f func()) {
	cl.t.Helper()
	before := cl.ctl.writes()
	f()
	deadline := time.Now().Add(settle)
	for cl.ctl.writes() == before {
		if time.Now().After(deadline) {
			cl.t.Fatalf("the policy controller has not written the maps in %v after the change", settle)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// logWriter hands the controller's warnings to the test's log.
type logWriter struct{ t testing.TB }

func (w logWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}
