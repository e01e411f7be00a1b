package agent

import (
	"log/slog"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ebpf-cni/ebpf-cni/pkg/buildinfo"
	"github.com/ebpf-cni/ebpf-cni/pkg/calls"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
	nodestate "github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// DefaultMetricsAddr is where the agent serves /metrics: every address of
// the node (Prometheus scrapes it from elsewhere), port 9967, next to the
// health port 9965 and clear of Cilium's 9962-9964, Calico's 9091-9094,
// node_exporter's 9100 and kindnet's 19080.
const DefaultMetricsAddr = ":9967"

// metricNames are the names of every metric the collectors declare (desc,
// declare), with their type: the docs, the dashboard and the alert rules
// are checked against them.
var (
	namesMu        sync.Mutex
	metricNames    = map[string]prometheus.ValueType{}
	histogramNames = map[string]bool{} // exported as _bucket, _sum and _count
	declareAll     sync.Once
)

// declare records a metric's name.
func declare(name string, t prometheus.ValueType, histogram bool) {
	namesMu.Lock()
	defer namesMu.Unlock()
	metricNames[name] = t
	if histogram {
		histogramNames[name] = true
	}
}

// desc declares one of the agent's metrics.
func desc(name string, t prometheus.ValueType, help string, labels ...string) *prometheus.Desc {
	declare(name, t, false)
	return prometheus.NewDesc(name, help, labels, nil)
}

// MetricNames lists the series names the agent exports (a histogram's as
// its _bucket, _sum and _count), sorted: what its collectors declare.
func MetricNames() []string {
	declareAll.Do(func() {
		none := nodestate.Node{}
		newDatapathCollector(&none, slog.Default())
		newCallsCollector(&none)
		newAgentCollector(nil)
		newPolicyCollector(nil)
	})
	namesMu.Lock()
	defer namesMu.Unlock()
	var out []string
	for n := range metricNames {
		if histogramNames[n] {
			out = append(out, n+"_bucket", n+"_sum", n+"_count")
		} else {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// Metrics is the agent's Prometheus registry: the datapath's counters and
// maps and the plugin's call record, read when scraped (nothing polls),
// and the agent's own state.
type Metrics struct {
	reg *prometheus.Registry
}

// NewMetrics reads the plugin's state on the node nd; a is
// the running agent (nil: no agent metrics, as in tests of the datapath).
func NewMetrics(nd *nodestate.Node, a *Agent, log *slog.Logger) *Metrics {
	if log == nil {
		log = slog.Default()
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(newDatapathCollector(nd, log))
	reg.MustRegister(newCallsCollector(nd))
	reg.MustRegister(newAgentCollector(a))
	return &Metrics{reg: reg}
}

// AddPolicy adds the NetworkPolicy controller's metrics.
func (m *Metrics) AddPolicy(pc *PolicyController) {
	m.reg.MustRegister(newPolicyCollector(pc))
}

// Registry is where the metrics are registered.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves /metrics and /healthz (200: the process answers).
func (m *Metrics) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	return mux
}

// Buckets of the call and phase latency histograms: 1 ms to 10 s.
var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// callsCollector feeds the plugin's call record (pkg/calls) into counters
// and histograms when scraped: what was appended since the last scrape,
// from the end of the file when the agent started.
type callsCollector struct {
	mu       sync.Mutex
	tail     *calls.Tail
	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec
	phases   *prometheus.HistogramVec
	bad      prometheus.Counter
	repairs  *prometheus.CounterVec
	// lastRepair is the end of the last call whose healing mended
	// something (unix ms), since the agent started; 0: none.
	lastRepair int64
	lastDesc   *prometheus.Desc
}

const (
	mCalls         = "ebpf_cni_cni_calls_total"
	mCallDuration  = "ebpf_cni_cni_call_duration_seconds"
	mPhaseDuration = "ebpf_cni_cni_phase_duration_seconds"
	mCallBad       = "ebpf_cni_cni_record_errors_total"
	mRepairs       = "ebpf_cni_heal_repairs_total"
)

func newCallsCollector(nd *nodestate.Node) *callsCollector {
	declare(mCalls, prometheus.CounterValue, false)
	declare(mCallBad, prometheus.CounterValue, false)
	declare(mRepairs, prometheus.CounterValue, false)
	declare(mCallDuration, prometheus.UntypedValue, true)
	declare(mPhaseDuration, prometheus.UntypedValue, true)
	return &callsCollector{
		tail: calls.NewTail(nd.StateDir()),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: mCalls,
			Help: "CNI calls of the plugin by verb (ADD, DEL, CHECK, STATUS, GC) and outcome: code 0 is success, else the CNI error code returned"},
			[]string{"verb", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: mCallDuration,
			Help: "how long a CNI call took, from the plugin's process start to its end", Buckets: latencyBuckets},
			[]string{"verb"}),
		phases: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: mPhaseDuration,
			Help: "how long each phase of a CNI call took (the phases EBPF_CNI_TIMING prints)", Buckets: latencyBuckets},
			[]string{"verb", "phase"}),
		bad: prometheus.NewCounter(prometheus.CounterOpts{Name: mCallBad,
			Help: "lines of the plugin's call record that were no record, or read errors"}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: mRepairs,
			Help: "what the plugin's healing mended (records rebuilt, attachments of gone pods reclaimed, leftovers removed), by the verb that healed"},
			[]string{"verb"}),
		lastDesc: desc("ebpf_cni_last_repair_timestamp_seconds", prometheus.GaugeValue,
			"when a plugin call last mended something while healing (unix seconds); absent until one did since the agent started"),
	}
}

func (c *callsCollector) Describe(ch chan<- *prometheus.Desc) {
	c.calls.Describe(ch)
	c.duration.Describe(ch)
	c.phases.Describe(ch)
	c.bad.Describe(ch)
	c.repairs.Describe(ch)
	ch <- c.lastDesc
}

func (c *callsCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	bad := c.tail.Bad
	recs, err := c.tail.Read()
	if err != nil {
		c.bad.Inc()
	}
	c.bad.Add(float64(c.tail.Bad - bad))
	for _, r := range recs {
		c.calls.WithLabelValues(r.Verb, strconv.FormatUint(uint64(r.Code), 10)).Inc()
		c.duration.WithLabelValues(r.Verb).Observe(r.Total / 1000)
		for p, ms := range r.Phases {
			c.phases.WithLabelValues(r.Verb, p).Observe(ms / 1000)
		}
		if r.Healed > 0 {
			c.repairs.WithLabelValues(r.Verb).Add(float64(r.Healed))
			c.lastRepair = max(c.lastRepair, r.Time)
		}
	}
	c.calls.Collect(ch)
	c.duration.Collect(ch)
	c.phases.Collect(ch)
	c.bad.Collect(ch)
	c.repairs.Collect(ch)
	if c.lastRepair != 0 {
		ch <- prometheus.MustNewConstMetric(c.lastDesc, prometheus.GaugeValue, float64(c.lastRepair)/1000)
	}
}

// agentCollector is the agent's own state: its build, its readiness, and
// the routes or tunnel endpoints it keeps.
type agentCollector struct {
	a                                               *Agent
	build, ready, peers, desired, present, lastSync *prometheus.Desc
	syncErrors, problems                            *prometheus.Desc
}

func newAgentCollector(a *Agent) *agentCollector {
	return &agentCollector{a: a,
		build: desc("ebpf_cni_agent_build_info", prometheus.GaugeValue,
			"1, labelled with the agent's version and the tag of the datapath programs of its build", "version", "programs_tag"),
		ready: desc("ebpf_cni_agent_ready", prometheus.GaugeValue,
			"1 when the agent's entries are current and its network policies, when on, run (what /readyz says), 0 if not"),
		peers: desc("ebpf_cni_agent_peers", prometheus.GaugeValue,
			"other nodes the agent keeps routes or tunnel endpoints for"),
		desired: desc("ebpf_cni_agent_routes_desired", prometheus.GaugeValue,
			"routes (mode direct) or tunnel endpoints (mode vxlan) the Node objects call for"),
		present: desc("ebpf_cni_agent_routes_present", prometheus.GaugeValue,
			"of those, the ones found installed at the last full sync"),
		lastSync: desc("ebpf_cni_agent_last_sync_timestamp_seconds", prometheus.GaugeValue,
			"when the last full sync with the Node objects ended (unix seconds)"),
		syncErrors: desc("ebpf_cni_agent_sync_errors_total", prometheus.CounterValue,
			"syncs (full or of one node) that failed and are retried"),
		problems: desc("ebpf_cni_agent_node_problems", prometheus.GaugeValue,
			"nodes whose Node object keeps the agent from routing them (no InternalIP, overlapping ranges...)"),
	}
}

func (c *agentCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.build, c.ready, c.peers, c.desired, c.present, c.lastSync, c.syncErrors, c.problems} {
		ch <- d
	}
}

func (c *agentCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.build, prometheus.GaugeValue, 1, buildinfo.Version, features.Tag())
	if c.a == nil {
		return
	}
	s := c.a.Status()
	ch <- prometheus.MustNewConstMetric(c.ready, prometheus.GaugeValue, b2f(s.Ready))
	ch <- prometheus.MustNewConstMetric(c.peers, prometheus.GaugeValue, float64(s.Peers))
	ch <- prometheus.MustNewConstMetric(c.desired, prometheus.GaugeValue, float64(s.Routes))
	ch <- prometheus.MustNewConstMetric(c.problems, prometheus.GaugeValue, float64(len(s.Problems)))
	st := c.a.syncStats()
	ch <- prometheus.MustNewConstMetric(c.present, prometheus.GaugeValue, float64(st.present))
	ch <- prometheus.MustNewConstMetric(c.syncErrors, prometheus.CounterValue, float64(st.errors))
	if !st.last.IsZero() {
		ch <- prometheus.MustNewConstMetric(c.lastSync, prometheus.GaugeValue, float64(st.last.UnixMilli())/1000)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// syncStats are what the metrics report of the agent's syncs.
type syncStats struct {
	last    time.Time // end of the last full sync
	present int       // owned entries found installed by it
	errors  int       // failed syncs so far
}

// policyCollector is the NetworkPolicy controller's state.
type policyCollector struct {
	pc                                    *PolicyController
	latency, up, synced, enforced, errors *prometheus.Desc
}

const mPolicyLatency = "ebpf_cni_policy_sync_duration_seconds"

func newPolicyCollector(pc *PolicyController) *policyCollector {
	declare(mPolicyLatency, prometheus.UntypedValue, true)
	return &policyCollector{pc: pc,
		latency: prometheus.NewDesc(mPolicyLatency,
			"from a change the network policies depend on (a policy, pod or namespace event, an endpoint of this node come or gone) to the policy maps written", nil, nil),
		up: desc("ebpf_cni_policy_up", prometheus.GaugeValue,
			"1 while the network policy controller runs (its maps open), 0 while it cannot start (bpfRoot not on a bpffs, maps that cannot be opened) and is retried; the agent's /readyz says why"),
		synced: desc("ebpf_cni_policy_synced", prometheus.GaugeValue,
			"1 once the agent has the network policies, pods and namespaces and has written the policy maps from them"),
		enforced: desc("ebpf_cni_policy_endpoints_enforced", prometheus.GaugeValue,
			"pods of this node that network policies isolate in at least one direction"),
		errors: desc("ebpf_cni_policy_errors_total", prometheus.CounterValue,
			"network policy writes that failed (a full map: the direction stays closed) and endpoints whose policies could not be compiled exactly (more port ranges than an entry holds)"),
	}
}

func (c *policyCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.latency, c.up, c.synced, c.enforced, c.errors} {
		ch <- d
	}
}

func (c *policyCollector) Collect(ch chan<- prometheus.Metric) {
	if c.pc == nil {
		return
	}
	st := c.pc.stats()
	buckets := make(map[float64]uint64, len(policyLatencyBuckets))
	var n uint64
	for i, b := range policyLatencyBuckets {
		n += st.hist.counts[i]
		buckets[b] = n
	}
	ch <- prometheus.MustNewConstHistogram(c.latency, st.hist.count, st.hist.sum, buckets)
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, b2f(st.running))
	ch <- prometheus.MustNewConstMetric(c.synced, prometheus.GaugeValue, b2f(st.synced))
	ch <- prometheus.MustNewConstMetric(c.enforced, prometheus.GaugeValue, float64(st.enforced))
	ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(st.errors))
}
