package deploy_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// metricRef is a name in a PromQL expression that is one of ours.
var metricRef = regexp.MustCompile(`\bebpf_cni_[a-z0-9_]+\b`)

// requireExported fails when expr names no metric of the agent, or one
// the agent does not export (agent.MetricNames: what its collectors
// declare). up is Prometheus' own, for a target it cannot scrape.
func requireExported(t *testing.T, where, expr string) {
	t.Helper()
	names := agent.MetricNames()
	refs := metricRef.FindAllString(expr, -1)
	require.True(t, len(refs) > 0 || strings.Contains(expr, "up{"), "%s: %q uses no metric of the agent", where, expr)
	for _, r := range refs {
		require.True(t, slices.Contains(names, r), "%s: %s is not a metric the agent exports (%q)", where, r, expr)
	}
}

// TestDashboardUsesExportedMetrics: deploy/grafana/ebpf-cni.json is a
// dashboard whose every query names metrics the agent exports.
func TestDashboardUsesExportedMetrics(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testutil.ModuleRoot(), "deploy/grafana/ebpf-cni.json"))
	require.NoError(t, err)
	var d struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(b, &d))
	require.NotEmpty(t, d.UID)
	require.NotEmpty(t, d.Panels)
	n := 0
	for _, p := range d.Panels {
		require.NotEmpty(t, p.Targets, p.Title)
		for _, tg := range p.Targets {
			requireExported(t, p.Title, tg.Expr)
			n++
		}
	}
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(map[string]any); ok {
			requireExported(t, "variable "+v.Name, q["query"].(string))
		}
	}
	require.GreaterOrEqual(t, n, 10)
}

// TestAlertRulesUseExportedMetrics: deploy/prometheus/alerts.yaml is a
// Prometheus rule file whose every alert has a name, an expression on the
// agent's metrics, a severity and a summary.
func TestAlertRulesUseExportedMetrics(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testutil.ModuleRoot(), "deploy/prometheus/alerts.yaml"))
	require.NoError(t, err)
	var f struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
	require.NoError(t, yaml.UnmarshalStrict(b, &f))
	require.NotEmpty(t, f.Groups)
	seen := map[string]bool{}
	for _, g := range f.Groups {
		require.NotEmpty(t, g.Name)
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Alert)
			require.False(t, seen[r.Alert], "alert %s twice", r.Alert)
			seen[r.Alert] = true
			requireExported(t, r.Alert, r.Expr)
			require.Contains(t, []string{"warning", "critical"}, r.Labels["severity"], r.Alert)
			require.NotEmpty(t, r.Annotations["summary"], r.Alert)
		}
	}
	for _, a := range []string{"EbpfCniAgentDown", "EbpfCniDropsRising", "EbpfCniMapFilling", "EbpfCniMapFull", "EbpfCniSlowAdd", "EbpfCniCallErrors", "EbpfCniRoutesOutOfSync"} {
		require.True(t, seen[a], "no alert %s", a)
	}
}

// TestEveryMetricDocumented: docs/operations.md's Metrics section names
// every metric the agent exports (a histogram by its own name), and every
// map whose fill it reports.
func TestEveryMetricDocumented(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testutil.ModuleRoot(), "docs/operations.md"))
	require.NoError(t, err)
	doc := string(b)
	start := strings.Index(doc, "\n## Metrics\n")
	require.GreaterOrEqual(t, start, 0, "docs/operations.md has a Metrics section")
	section := doc[start+1:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	for _, n := range agent.MetricNames() {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(n, suffix); ok && slices.Contains(agent.MetricNames(), base+"_bucket") {
				n = base
			}
		}
		require.Contains(t, section, "`"+n+"`", "docs/operations.md (Metrics) does not document %s", n)
	}
	fillable := maps.Fillable()
	require.Contains(t, fillable, maps.CniMapNat)
	for m := range fillable {
		require.Contains(t, section, "`"+m+"`", "docs/operations.md (Metrics) does not name map %s among those whose fill is reported", m)
	}
}
