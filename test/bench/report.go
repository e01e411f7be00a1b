package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// report renders REPORT.md and the terminal summary from the rows.
type report struct {
	Rows     []Row
	Profile  string
	Note     string
	Features []string
	Versions [][2]string
	Runs     int
	Dur      time.Duration
	// CRRRounds of CRRDur each; 0 for a run from before CRR had rounds of
	// its own (and whose ratios were not paired).
	CRRRounds int
	CRRDur    time.Duration
	CNIRounds int
	Elapsed   time.Duration
	Failed    []string
	Plots     []string
	Date      time.Time
}

// fmtNum prints a figure with three significant digits, thousands grouped.
func fmtNum(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1000:
		s := fmtInt(math.Abs(math.Round(v)))
		if v < 0 {
			s = "-" + s
		}
		return s
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	case a == 0:
		return "0"
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

func cell(v *float64) string {
	if v == nil {
		return "–"
	}
	return fmtNum(*v)
}

func ratioCell(v *float64) string {
	if v == nil {
		return "–"
	}
	return fmt.Sprintf("%.2fx", *v)
}

func gapCell(v *float64) string {
	if v == nil {
		return "–"
	}
	return fmt.Sprintf("%.0f%%", *v*100)
}

func noiseCell(r Row) string {
	var parts []string
	for _, s := range setups {
		switch p := r.Spread[s]; {
		case p != nil:
			parts = append(parts, fmt.Sprintf("%.0f%%", *p))
		case r.value(s) != nil:
			parts = append(parts, "1 run")
		default:
			parts = append(parts, "–")
		}
	}
	return strings.Join(parts, " / ")
}

var verdictCell = map[string]string{isBetter: "✅ better", isWorse: "❌ worse", cannotTell: "≈ cannot tell", "noise": "≈ within noise", "": ""}

// pairedCell is a ratio judged by rounds, "1.02x (0.99–1.05)": the pooled
// ratio and its 95% interval; without an interval (one round) the pooled
// ratio alone, and without pairs the ratio of the medians num/den.
func pairedCell(p *Paired, num, den *float64) string {
	switch {
	case p == nil:
		return ratioCell(ratio(num, den))
	case p.CILow == nil:
		return fmt.Sprintf("%.2fx", p.Ratio)
	default:
		return fmt.Sprintf("%.2fx (%.2f–%.2f)", p.Ratio, *p.CILow, *p.CIHigh)
	}
}

// roundsCell is how many rounds gave the row's ratios.
func roundsCell(r Row) string {
	for _, k := range []string{ebpfRef, ebpfRaw} {
		if p := r.Paired[k]; p != nil {
			return fmt.Sprint(p.Rounds)
		}
	}
	return "–"
}

// rawVerdictCell is EBPF against RAW, the limit: plain words, since being
// below the limit is no fault.
func rawVerdictCell(r Row) string {
	if p := r.Paired[ebpfRaw]; p != nil {
		return p.Verdict
	}
	return ""
}

// anyPaired says whether the rows come from a run that paired its rounds.
func anyPaired(rows []Row) bool {
	return slices.ContainsFunc(rows, func(r Row) bool { return len(r.Paired) > 0 })
}

// paths lists the rows' paths in their order.
func paths(rows []Row) []string {
	var out []string
	for _, r := range rows {
		if !slices.Contains(out, r.Path) {
			out = append(out, r.Path)
		}
	}
	return out
}

func (rp report) markdown() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# ebpf-cni benchmark report\n\n")
	if rp.CRRRounds > 0 {
		w("Profile **%s** (REF, EBPF and RAW back to back in every round, in an order that rotates from round to round: %d rounds of %s per RR and TCP figure, %d of %s per CRR figure, %d of the cni paths' churn; medians per setup, ratios pooled over the rounds), %s, took %s. ",
			rp.Profile, rp.Runs, rp.Dur, rp.CRRRounds, rp.CRRDur, rp.CNIRounds, rp.Date.Format("2006-01-02 15:04 UTC"), rp.Elapsed.Round(time.Second))
	} else {
		w("Profile **%s** (%d runs of %s per traffic figure, medians), %s, took %s. ", rp.Profile, rp.Runs, rp.Dur,
			rp.Date.Format("2006-01-02 15:04 UTC"), rp.Elapsed.Round(time.Second))
	}
	w("Figures drift on shared machines: compare the columns of this run, not absolute values across runs.\n\n")
	if rp.Note != "" {
		w("> %s\n\n", rp.Note)
	}
	if len(rp.Failed) > 0 {
		w("**Paths that failed** (their rows are incomplete):\n\n")
		for _, f := range rp.Failed {
			w("- %s\n", f)
		}
		w("\n")
	}
	w("%s", legend(rp.Features, anyPaired(rp.Rows)))
	if slices.Contains(rp.Plots, "ratios.png") {
		w("![EBPF vs REF on every row](ratios.png)\n\n")
	}
	for _, p := range paths(rp.Rows) {
		w("%s", rp.pathSection(p))
	}
	sweepPlots := slices.DeleteFunc(slices.Clone(rp.Plots), func(s string) bool { return s == "ratios.png" || s == "summary.png" })
	if len(sweepPlots) > 0 {
		w("## Scale sweeps\n\n")
		for _, p := range sweepPlots {
			w("![%s](%s)\n", strings.TrimSuffix(p, ".png"), p)
		}
		w("\n")
	}
	w("## Where EBPF loses to REF, and why\n\n")
	w("%s", rp.closingNote())
	w("## Machine and tools\n\n| | |\n| --- | --- |\n")
	for _, kv := range rp.Versions {
		w("| %s | %s |\n", kv[0], strings.ReplaceAll(kv[1], "|", "\\|"))
	}
	w("\nReproduce: `sudo make bench` (full, 33-37 minutes on 2 vCPUs, ebpf-ipam's own bench included) or `sudo BENCH=quick make bench` (about 7 minutes, same rows, fewer rounds). ")
	w("EBPF features are switched on in `ebpfFeatures` of test/bench/setups.go or with `-ebpf-features masq,hostport,bandwidth`.\n")
	return b.String()
}

// legend says what REF, EBPF (with features on) and RAW are and how to read
// a path's table, whose ratios are paired by rounds or (a run from before
// that) ratios of medians.
func legend(features []string, paired bool) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("| setup | what it is |\n| --- | --- |\n")
	w("| REF | Debian's `bridge` (isGateway, ipMasq) + `host-local` + `portmap` + `bandwidth`, iptables |\n")
	w("| EBPF | `ebpf-cni` + `ebpf-ipam`, default attach mode, stateDir on a tmpfs (its default /run/ebpf-cni is one on a node; REF's host-local keeps its default, on disk); features on: %s |\n", featureList(features))
	w("| RAW | the limit: two namespaces joined by one veth; for paths through the node, a namespace routed by the node with no NAT and no rules; for `cni`, the same veth, address and route made in-process with netlink |\n\n")
	if !paired {
		w("How to read a table: **EBPF/REF** and **EBPF/RAW** are plain ratios of the figures (for a metric where lower is better, below 1x means EBPF is better); ")
		w("**gap closed** is (EBPF−REF)/(RAW−REF): 100%% means EBPF reaches the raw limit, 0%% no better than REF, negative worse than REF; ")
		w("**noise** is (max−min)/median of the runs of REF / EBPF / RAW; a difference smaller than the noise (or under 10%% between two single runs) is called *within noise*.\n\n")
		return b.String()
	}
	w("How to read a table: REF, EBPF and RAW are the medians of each setup's rounds. ")
	w("**EBPF/REF** and **EBPF/RAW** are judged by pairs: every round runs the setups back to back, in an order that rotates from round to round, and takes the ratio within the round; ")
	w("the cell is the geometric mean of the rounds' ratios with its 95%% confidence interval in brackets (Student's t over their logarithms), over **rounds** rounds ")
	w("(for a metric where lower is better, below 1x means EBPF is better). ")
	w("**EBPF vs REF** and **EBPF vs RAW** say *better* or *worse* only when the whole interval lies on that side of 1x, and *cannot tell* when it straddles 1x or comes from a single round. ")
	w("A ratio without brackets from more than one round is of the medians: the setups were not measured in the same rounds (hostPort's RAW beyond the first N). ")
	w("**gap closed** is (EBPF−REF)/(RAW−REF) of the medians: 100%% means EBPF reaches the raw limit, 0%% no better than REF, negative worse than REF; ")
	w("**noise** is (max−min)/median of the rounds of REF / EBPF / RAW, the spread that pairing takes out of the ratios.\n\n")
	return b.String()
}

// pathSection is path p's section: what it measures, then its table (the
// phases' own table for phasesPath) with why a setup has no figure, and
// the comparison of a path measured in two states.
func (rp report) pathSection(p string) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("## %s\n\n", p)
	if d := pathDoc[strings.TrimRightFunc(p, func(r rune) bool { return r == '-' || (r >= '0' && r <= '9') })]; d != "" {
		w("%s\n\n", d)
	}
	if p == phasesPath {
		w("%s\n", phaseTable(rp.Rows))
		return b.String()
	}
	w("| metric | unit | better | REF | EBPF | RAW | EBPF/REF | EBPF/RAW | gap closed | noise | rounds | EBPF vs REF | EBPF vs RAW |\n")
	w("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- | --- |\n")
	nulls := map[string][]string{} // "SETUP: reason" -> metrics
	var order []string
	for _, r := range rp.Rows {
		if r.Path != p {
			continue
		}
		w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.Metric, r.Unit, r.Better,
			cell(r.Ref), cell(r.EBPF), cell(r.Raw), pairedCell(r.Paired[ebpfRef], r.EBPF, r.Ref), pairedCell(r.Paired[ebpfRaw], r.EBPF, r.Raw),
			gapCell(gapClosed(r.Ref, r.EBPF, r.Raw)), noiseCell(r), roundsCell(r), verdictCell[verdict(r)], rawVerdictCell(r))
		for _, s := range setups {
			if why, ok := r.Null[s]; ok {
				k := setupName[s] + ": " + why
				if _, seen := nulls[k]; !seen {
					order = append(order, k)
				}
				nulls[k] = append(nulls[k], r.Metric)
			}
		}
	}
	for _, k := range order {
		w("\n– %s (%s)", k, strings.Join(nulls[k], ", "))
	}
	if len(order) > 0 {
		w("\n")
	}
	w("\n")
	w("%s", concurrencySection(rp.Rows, p))
	if p == monitorPath {
		w("%s", monitorComparison(rp.Rows))
	}
	if p == policyPath {
		w("%s", stateComparison(rp.Rows, policyPath, "none", "1000", "1,000 NetworkPolicies selecting the pair", 0))
		w("%s", stateComparison(rp.Rows, policyPath, "none", "cnp1000", "1,000 ClusterNetworkPolicies selecting the pair", 0))
		w("%s", latencySection(rp.Rows))
	}
	return b.String()
}

// pathDoc says what each path measures.
var pathDoc = map[string]string{
	"cni":          "CNI ADD and DEL through libcni exactly as a runtime calls the chain, at concurrency 1 and 8 (`_c8`); pods_per_s is ADD+DEL pairs per second (the namespaces are made beforehand); add_cold_ms is the first ADD on a fresh node as its installation leaves it (EBPF: fresh bpffs state, and STATUS run once as the DaemonSet's init container does, which loads and verifies the programs: load_ms), one fresh node per run. Set EBPF_CNI_TIMING to see each ADD's and DEL's phases (docs/performance.md).",
	phasesPath:     "Where EBPF's ADDs and DELs of the cni path spend their time, from the plugin's own phase timings (EBPF_CNI_TIMING, written to a file during the churn): the median of each phase per round, then the median of the rounds. ADD: start (the Go runtime, reading stdin), parse, netns, open (the node lock), programs (finding the pinned set), ipam (in-process ebpf-ipam), veth (the pair, its addresses, routes, sysctls), then one phase per feature (masquerade checks the uplinks; endpoint attaches the host veth's programs), record, print. DEL: teardown (the endpoint's entries, the veth and its filters), ipam, release. total is the plugin's own time from its process start; outside is the caller's ADD (or DEL) p50 less total: the exec and libcni. What the phases showed and what was changed: docs/performance.md.",
	"cni-upstream": "As cni, with REF the current upstream reference plugins (containernetworking/plugins at the version go.mod requires, built from the module: bridge, host-local, portmap, bandwidth) instead of Debian's 1.1.1, on a node of its own; EBPF measured again beside it.",
	"pod-to-pod": "Two pods on one node. rr: 1-byte TCP ping-pong over one connection (the project's load generator; client and server pinned to one CPU, since a cross-CPU wakeup on this VM costs more than the whole round trip); crr: connect, 1-byte request/response, close; tcp: iperf3 with 1 and 2 streams. " +
		"cpu_us_per_tx/conn: busy time (/proc/stat) of the CPU that client, server and their packets' softirq work share, divided by transactions; other load that ran on that CPU lands in it too. bpf_*_ns_pkt: run_time_ns/run_cnt of each program from BPF run-time statistics, switched on for a separate RR run (bpf_crr_*: a separate CRR run).",
	monitorPath:  "Pod-to-pod RR and CRR of EBPF (as pod-to-pod) with the live event stream of `ebpf-cni monitor` off (`_off`) and on (`_on`): on is a reader holding the lease and draining the ring buffer (decoding, not printing), with flow events on at `monitor --flows`'s defaults (one flow in 10 sampled, 1000 events per second per CPU); the two alternate within every run. bpf_rr_*/bpf_crr_*_ns_pkt: run_time_ns/run_cnt of each program during a separate RR or CRR run with BPF run-time statistics on. The table below compares on with off: the run time per packet may grow by at most 5%, RR/CRR should stay within the runs' noise.",
	policyPath:   "Pod-to-pod RR and CRR of EBPF between two pods that 1,000 NetworkPolicies select (`_1000`: each admits the pair plus one of 994 peer pods on a port of its own, both ways), between two pods that 1,000 ClusterNetworkPolicies select (`_cnp1000`: an Admin Accept of the pair on the echo port first, then Admin Denies and Baseline Accepts of one peer on a port of its own, a Baseline Deny of everything last), beside two pods of a namespace without policies (`_none`), in an order that rotates from run to run; the change columns are the ratios of the runs, each against `_none` in the same run, with their 95% interval. The agent compiled both kinds from a fake API of 1,000 pods. A new flow's first packet does one LPM lookup per policied side and two flow-decision writes; established flows one hash lookup. bpf_*_ns_pkt: run time per packet of each program, measured as on pod-to-pod. agent_sync: the policy controller's time from a policy change (a port of one NetworkPolicy) to its maps written, over 20 changes per run, one at a time. enforce and revoke (`_np`, `_cnp`): from the API write of a change of a probe policy to the first connection that sees it, 20 cycles per run (table below the comparisons).",
	"scale":      "The node agent at 1,000 nodes / 30,000 pods in 1,000 namespaces against a real kube-apiserver and etcd (make scale, test/scale; docs/scale.md): 20 agents (mode vxlan) in network namespaces of their own, each with a private bpffs and 3 pods attached by the plugin. rss/cpu: the agents' medians at rest (CPU over 60 s); policy_apply: from the API write of a policy change to the entry in the maps of the node whose pod it selects (30,000 policies); peer_label: a pod labelled into or out of a policy's peers, to every agent that must know; node_routes: a Node added or re-registered with a new pod range, to its tunnel endpoint on all agents; churn: 100 pod creations and 100 deletions a second for 60 s, the maps checked against a compilation from scratch after it; watch_bytes: what one agent is sent (TLS bytes, through a counting proxy) per pod write; first_sync: one agent started on the full cluster until its maps are complete.",
	"masquerade": "A pod to a host beyond the node's uplink (the world namespace): RR, CRR, iperf3. REF masquerades with iptables; RAW is routed by the node with no NAT. bpf_*_ns_pkt / bpf_crr_*_ns_pkt: each program's run time per packet in separate RR / CRR runs with BPF run-time statistics on (to_netdev translates the pod's packets, from_netdev the replies).",
	"hostport":   "A client beyond the uplink to a hostPort of the node, with N mappings installed (filler pods of up to 500 mappings each); add/del_p50_ms: ADD and DEL of a pod with one more mapping; del_<phase>_ms: the phases of EBPF's DELs of that pod (EBPF_CNI_TIMING: teardown unpublishes the port, flushes the pod's flows and removes the endpoint and the veth), del_outside_ms the caller's DEL less the plugin's total (the exec, libcni). RAW: the client reaches the routed namespace directly, measured once and repeated on every N.",
	"bandwidth":  "A pod limited to R Mbit/s (burst 10 ms of R) exchanges iperf3 TCP with the world: egress (the pod sends; metrics without prefix) and ingress (the world sends, iperf3 -R; `in_`). The error of the achieved rate against R, over the whole run, in its first second and in its worst second, as the receiver saw them; sat_rtt: median ping round trip from the pod to the world while iperf3 saturates the limit (latency under saturation). REF shapes with tbf queues (an ifb for egress). EBPF has no queue (this kernel has no fq): TCP sent by the pod is paced at its source to R (SO_MAX_PACING_RATE, set by a sock_ops hook), and the world's TCP, an outside sender, meets the token bucket alone.",
}

// closingNote is the one list of where EBPF loses to REF: grouped by
// cause, each cause said once with every row it explains (rows worse
// beyond noise first, then those worse by less than the runs' spread).
func (rp report) closingNote() string {
	var b strings.Builder
	type group struct {
		worse, unsure, noise []Row
	}
	groups := map[string]*group{}
	var order []string
	for _, r := range rp.Rows {
		v := verdict(r)
		if v != isWorse && v != cannotTell && v != "noise" {
			continue
		}
		if a := advantage(r); v != isWorse && (a == nil || *a >= 1) {
			continue
		}
		c := causeOf(r)
		g := groups[c]
		if g == nil {
			g = &group{}
			groups[c] = g
			order = append(order, c)
		}
		switch v {
		case isWorse:
			g.worse = append(g.worse, r)
		case cannotTell:
			g.unsure = append(g.unsure, r)
		default:
			g.noise = append(g.noise, r)
		}
	}
	switch {
	case len(order) == 0:
		b.WriteString("EBPF is not worse than REF on any row measured for both.\n")
	case anyPaired(rp.Rows):
		b.WriteString("Every row where EBPF's figure is worse than REF's, grouped by cause. **Worse** rows have the whole 95% interval of EBPF/REF on the worse side of 1x; *cannot tell* rows are nominally worse, but their interval includes 1x (or comes from one round).\n\n")
	default:
		b.WriteString("Every row where EBPF's figure is worse than REF's, grouped by cause. **Worse** rows are beyond the runs' noise; *within noise* rows are nominally worse by less than the runs' own spread.\n\n")
	}
	// Causes with a row worse beyond noise come first.
	slices.SortStableFunc(order, func(a, b string) int {
		return min(len(groups[b].worse), 1) - min(len(groups[a].worse), 1)
	})
	for _, c := range order {
		g, cs := groups[c], causes[c]
		fmt.Fprintf(&b, "### %s\n\n", cs.title)
		if len(g.worse) > 0 {
			fmt.Fprintf(&b, "**Worse:** %s.\n\n", rowList(g.worse))
		}
		if len(g.unsure) > 0 {
			fmt.Fprintf(&b, "*Cannot tell:* %s.\n\n", rowList(g.unsure))
		}
		if len(g.noise) > 0 {
			fmt.Fprintf(&b, "*Within noise:* %s.\n\n", rowList(g.noise))
		}
		fmt.Fprintf(&b, "Why: %s\n\nFix: %s\n\n", cs.why, cs.fix)
	}
	var missing []string
	for _, r := range rp.Rows {
		if r.EBPF == nil && r.Null[EBPF] == notImplemented && !slices.Contains(missing, pathBase(r.Path)) {
			missing = append(missing, pathBase(r.Path))
		}
	}
	if len(missing) > 0 {
		fmt.Fprintf(&b, "Not measured for EBPF, %s: %s. Their REF (and RAW) columns are the baseline the features will be judged against.\n\n",
			notImplemented, strings.Join(missing, ", "))
	}
	return b.String()
}

// rowList names rows with their figures: "`path metric` EBPF x vs REF y
// unit (r)", r the pooled ratio and its interval where the rounds gave
// them, else the ratio of the medians.
func rowList(rows []Row) string {
	var parts []string
	for _, r := range rows {
		parts = append(parts, fmt.Sprintf("`%s %s` %s vs %s %s (%s)", r.Path, r.Metric, cell(r.EBPF), cell(r.Ref), r.Unit,
			pairedCell(r.Paired[ebpfRef], r.EBPF, r.Ref)))
	}
	return strings.Join(parts, "; ")
}

func pathBase(p string) string {
	if strings.HasPrefix(p, "hostport-") {
		return "hostport"
	}
	return p
}

// cause is why EBPF loses on some rows, and what would fix it, from what
// is known of the datapath and the plugins (see DESIGN.md).
type cause struct{ title, why, fix string }

var causes = map[string]cause{
	"add_cold": {"The first ADD on a node attaches the uplink programs",
		"the first ADD on a node (after STATUS loaded the programs: load_ms) attaches the uplink programs and writes the node-wide maps, where REF creates the bridge and its iptables chains.",
		"attach the uplinks at STATUS too."},
	"attach": {"ADD creates the veth pair and attaches the programs",
		"ADD's phases (EBPF_CNI_TIMING): the exec of ebpf-cni (~2 ms), the veth pair with its addresses, routes and sysctls (~2.3 ms), the uplink check of masquerade (~0.8 ms), IPAM in-process (~0.6 ms), the attach (tc filters, ~0.5 ms), the record; REF spends its time exec-ing four plugins and iptables.",
		"fewer netlink round trips for the veth; check the uplinks once per node change, not per ADD."},
	"detach": {"DEL deletes the veth under RTNL",
		"DEL removes the endpoint's entries, the veth (its tc filters go with it) and the record, under the node lock.",
		"see the phases of DEL (EBPF_CNI_TIMING)."},
	"churn": {"ADD+DEL pairs per second pay both attach and detach",
		"the sum of the ADD and DEL costs (attach and detach, serialised by the node lock and RTNL), which concurrency cannot hide.",
		"as for ADD and DEL."},
	"cpu": {"CPU accounting on a shared machine",
		"machine-wide /proc/stat accounting on a shared 2-CPU machine; the figure includes whatever else ran.",
		"rerun on an idle machine; if it persists, profile with perf the softirq path of the from-container program."},
	"tail": {"Tail latency of short runs on a shared 2-vCPU VM",
		"a p99 of a 1 s run on a shared 2-vCPU VM is set by whatever else was scheduled on the CPU (the median of the same runs favours EBPF), and the spread between runs exceeds the difference.",
		"none in the datapath; the full profile (5 runs of 3 s) on an idle machine gives a tail worth comparing."},
	"policed": {"An outside sender against an ingress limit is policed, not queued (no fq on this kernel)",
		"the world is an outside sender, which only a token bucket can hold on this kernel (no fq, no BPF qdisc: nowhere to queue). A veth's round trip (tens of µs) is shorter than a packet's time at the rate, so TCP cannot slow down through its window; it overdrives the bucket, loses whole flights and waits for its retransmission timer, and the recovery credit makes the time up in later seconds (some land above the rate). TCP sent on the node is paced at its source instead (the egress rows).",
		"a queue: fq (the EDT mode exists for the stack path) or a BPF qdisc (CONFIG_NET_SCH_BPF) on kernels that have them."},
	"pace1g": {"Pacing 1 Gbit/s needs most of a vCPU",
		"at 1 Gbit/s a paced flow needs most of a vCPU for its pacing timer and iperf3; a single quick run on the 2-vCPU VM shares it with the node's softirqs (the full profile, 3 runs of 5 s: 951-965 Mbit/s every second, within 5%).",
		"none in the datapath; compare the full profile."},
	"spread": {"Run-to-run spread of the machine",
		"on this 2-vCPU VM the difference is smaller than the run could tell apart: the 95% interval of the rounds' ratios includes 1x (in a run from before rounds were paired: the runs' spread exceeded the difference).",
		"more rounds (`-runs`, `-crr-rounds`) or an idle machine narrow the interval; if it stays nominally worse, compare bpf_*_ns_pkt with the gap."},
	"datapath": {"EBPF's datapath costs more than REF's on this path",
		"the whole 95% interval of the rounds' ratios lies on the worse side: REF and EBPF ran back to back in every round, so the machine's drift does not explain it. Where the time goes: the programs' run time per packet (the path's bpf_*_ns_pkt rows) against the gap.",
		"profile the path (`-hold`, docs/performance.md) and shorten what its programs do per packet or per new flow."},
	"unknown": {"Not explained yet",
		"no explanation recorded yet: investigate before relying on these rows.",
		"unknown."},
}

// causeOf says which cause explains a row where EBPF loses.
func causeOf(r Row) string {
	m := r.Metric
	switch {
	case strings.HasPrefix(r.Path, "cni") && strings.HasPrefix(m, "add_cold"):
		return "add_cold"
	case strings.HasPrefix(r.Path, "cni") && strings.HasPrefix(m, "add"):
		return "attach"
	case strings.HasPrefix(r.Path, "cni") && strings.HasPrefix(m, "del"):
		return "detach"
	case strings.HasPrefix(r.Path, "cni") && strings.HasPrefix(m, "pods_per_s"):
		return "churn"
	case strings.HasPrefix(m, "cpu_"):
		return "cpu"
	case strings.HasSuffix(m, "_p99_us"):
		return "tail"
	case r.Path == "bandwidth" && strings.HasPrefix(m, "in_") && !strings.Contains(m, "sat_rtt"):
		return "policed"
	case r.Path == "bandwidth" && strings.Contains(m, "1000mbit") && !strings.Contains(m, "sat_rtt"):
		return "pace1g"
	case (strings.HasPrefix(m, "rr") || strings.HasPrefix(m, "crr") || strings.HasPrefix(m, "tcp")) && verdict(r) == isWorse:
		return "datapath"
	case strings.HasPrefix(m, "rr") || strings.HasPrefix(m, "crr") || strings.HasPrefix(m, "tcp"):
		return "spread"
	}
	return "unknown"
}

// summary is the terminal version: one line per row.
func (rp report) summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-14s %-24s %12s %12s %12s %20s %8s  %s\n", "path", "metric", "REF", "EBPF", "RAW", "EBPF/REF (95%)", "gap", "")
	for _, r := range rp.Rows {
		fmt.Fprintf(&b, "%-14s %-24s %12s %12s %12s %20s %8s  %s\n", r.Path, r.Metric+" ("+r.Unit+")", cell(r.Ref), cell(r.EBPF), cell(r.Raw),
			pairedCell(r.Paired[ebpfRef], r.EBPF, r.Ref), gapCell(gapClosed(r.Ref, r.EBPF, r.Raw)), verdict(r))
	}
	return b.String()
}

// concurrencyAim is how many times the pairs per second of one at a time
// EBPF should reach with 8 in parallel (shared/BENCHMARK.md, issue 58).
const concurrencyAim = 1.6

// concurrencySection judges concurrency on path by throughput: each
// setup's figure at concurrency 8 over its own at 1 in the same round
// (the rows of concurrencyOf), pooled over the rounds, and EBPF's against
// concurrencyAim. Latency at 8 against 1 says how calls queue, not what
// running them in parallel gains.
func concurrencySection(rows []Row, path string) string {
	var b strings.Builder
	for _, r := range rows {
		c1, ok := concurrencyOf[r.Metric]
		if r.Path != path || !ok {
			continue
		}
		i := slices.IndexFunc(rows, func(x Row) bool { return x.Path == path && x.Metric == c1 })
		if i < 0 {
			continue
		}
		fmt.Fprintf(&b, "Concurrency, judged by throughput: `%s` over `%s`, each setup's %s with 8 calls in parallel over one at a time in the same round, pooled over the rounds (a ratio without interval is of the medians). EBPF's aim is %.1fx.\n\n",
			r.Metric, c1, r.Unit, concurrencyAim)
		b.WriteString("| setup | 8 in parallel / 1 at a time | rounds | vs 1x | EBPF's aim |\n| --- | ---: | ---: | --- | --- |\n")
		for _, s := range setups {
			p := r.Paired[concKey(s)]
			cellText := pairedCell(p, r.value(s), rows[i].value(s))
			if cellText == "–" {
				continue
			}
			rounds, vs, aim := "–", "", ""
			if p != nil {
				rounds, vs = fmt.Sprint(p.Rounds), p.Verdict
			}
			if s == EBPF {
				aim = aimCell(p)
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", setupName[s], cellText, rounds, vs, aim)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// aimCell judges a concurrency ratio's interval against concurrencyAim.
func aimCell(p *Paired) string {
	switch {
	case p == nil: // a run from before rounds were paired
		return ""
	case p.CILow == nil:
		return cannotTell
	}
	switch judge(*p.CILow, *p.CIHigh, concurrencyAim, "higher") {
	case isBetter:
		return fmt.Sprintf("✅ met (interval above %.1fx)", concurrencyAim)
	case isWorse:
		return fmt.Sprintf("❌ missed (interval below %.1fx)", concurrencyAim)
	default:
		return cannotTell
	}
}
