package agent

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes"

	"github.com/ebpf-cni/ebpf-cni/internal/kubetest"
)

// TestAgentSurvivesAPIServerRestart runs the agent against an API server
// over HTTP (real client-go transport, reflector and watch decoding). The
// server goes down; meanwhile a node is deleted and another added; the
// agent keeps its entries while the server is away, and when the server is
// back (with its watch history lost: "too old resource version") it lists
// again and applies both changes.
func TestAgentSurvivesAPIServerRestart(t *testing.T) {
	api, err := kubetest.New()
	require.NoError(t, err)
	t.Cleanup(api.Close)
	api.Apply(node("self", []string{"192.0.2.10"}, "10.244.0.0/24"))
	api.Apply(node("b", []string{"192.0.2.11"}, "10.244.1.0/24"))
	client, err := kubernetes.NewForConfig(api.Config())
	require.NoError(t, err)

	routes := newMem()
	a, err := New(client, routes, Config{NodeName: "self", Resync: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = a.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	h := &harness{t: t, routes: routes, agent: a}

	h.eventually("10.244.1.0/24 via 192.0.2.11")
	h.ready()
	api.Apply(node("c", []string{"192.0.2.12"}, "10.244.2.0/24"))
	h.eventually("10.244.1.0/24 via 192.0.2.11", "10.244.2.0/24 via 192.0.2.12")

	lists := api.Count("list") + api.Count("watch")
	api.Stop()
	api.Delete("b")
	api.Apply(node("d", []string{"192.0.2.13"}, "10.244.3.0/24"))
	require.Equal(t, []string{"10.244.1.0/24 via 192.0.2.11", "10.244.2.0/24 via 192.0.2.12"}, routes.snapshot(), "the API server's absence removed nothing")
	require.NoError(t, api.Start())
	h.eventually("10.244.2.0/24 via 192.0.2.12", "10.244.3.0/24 via 192.0.2.13")
	require.Greater(t, api.Count("list")+api.Count("watch"), lists, "the agent asked again")
	h.ready()

	// And the watch after the restart delivers events again.
	api.Delete("c")
	h.eventually("10.244.3.0/24 via 192.0.2.13")
}
