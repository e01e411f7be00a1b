package agent

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/ebpf-cni/ebpf-cni/internal/nodetest"
	"github.com/ebpf-cni/ebpf-cni/pkg/buildinfo"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
)

// gauge is the value of an unlabelled metric of reg, and whether it is
// there.
func gauge(t assert.TestingT, reg *prometheus.Registry, name string) (float64, bool) {
	fams, err := reg.Gather()
	assert.NoError(t, err)
	for _, f := range fams {
		if f.GetName() != name || len(f.Metric) != 1 {
			continue
		}
		m := f.Metric[0]
		if m.Counter != nil {
			return m.Counter.GetValue(), true
		}
		return m.Gauge.GetValue(), true
	}
	return 0, false
}

// TestAgentMetrics: the agent's own series follow its syncs: routes the
// Node objects call for against those installed, failed syncs counted,
// readiness, the last full sync's time; its build is labelled.
func TestAgentMetrics(t *testing.T) {
	routes := newMem()
	routes.failNext = 1 << 30 // every Ensure fails until reset
	h := start(t, routes, fake.NewClientset(node("self", []string{"192.0.2.10"}, "10.244.0.0/24"),
		node("b", []string{"192.0.2.11"}, "10.244.1.0/24")))
	reg := NewMetrics(nodetest.Handle(t, t.TempDir(), t.TempDir()), h.agent, nil).Registry()

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		errs, _ := gauge(c, reg, "ebpf_cni_agent_sync_errors_total")
		assert.Positive(c, errs)
		desired, _ := gauge(c, reg, "ebpf_cni_agent_routes_desired")
		assert.Equal(c, 1.0, desired)
		present, ok := gauge(c, reg, "ebpf_cni_agent_routes_present")
		assert.True(c, ok)
		assert.Zero(c, present, "the route could not be installed")
		ready, _ := gauge(c, reg, "ebpf_cni_agent_ready")
		assert.Zero(c, ready)
	}, 10*time.Second, 20*time.Millisecond)

	routes.mu.Lock()
	routes.failNext = 0
	routes.mu.Unlock()
	h.eventually("10.244.1.0/24 via 192.0.2.11")
	start := time.Now()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		present, _ := gauge(c, reg, "ebpf_cni_agent_routes_present")
		assert.Equal(c, 1.0, present)
		ready, _ := gauge(c, reg, "ebpf_cni_agent_ready")
		assert.Equal(c, 1.0, ready)
		peers, _ := gauge(c, reg, "ebpf_cni_agent_peers")
		assert.Equal(c, 1.0, peers)
		last, _ := gauge(c, reg, "ebpf_cni_agent_last_sync_timestamp_seconds")
		assert.GreaterOrEqual(c, last, float64(start.UnixMilli())/1000)
	}, 10*time.Second, 20*time.Millisecond)

	fams, err := reg.Gather()
	require.NoError(t, err)
	found := false
	for _, f := range fams {
		if f.GetName() == "ebpf_cni_agent_build_info" {
			labels := map[string]string{}
			for _, l := range f.Metric[0].Label {
				labels[l.GetName()] = l.GetValue()
			}
			require.Equal(t, map[string]string{"version": buildinfo.Version, "programs_tag": features.Tag()}, labels)
			found = true
		}
	}
	require.True(t, found)
}
