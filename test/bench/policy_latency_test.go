package main

import (
	"strings"
	"testing"
	"time"
)

// TestDecided: when the first connection attempt that saw a change
// started, from the attempts' states in start order.
func TestDecided(t *testing.T) {
	t0 := time.Unix(1000, 0)
	mk := func(states ...int) []*attempt {
		var atts []*attempt
		for i, s := range states {
			atts = append(atts, &attempt{fd: -1, start: t0.Add(time.Duration(i) * time.Millisecond), state: s})
		}
		return atts
	}
	const p, ok, no = attemptPending, attemptOK, attemptDenied
	for _, tc := range []struct {
		name    string
		states  []int
		allowed bool
		want    int // index of the attempt; -1: not decided yet
	}{
		{"allowed: the first success", []int{no, no, ok, ok}, true, 2},
		{"allowed: an older attempt still pending", []int{no, p, ok}, true, -1},
		{"allowed: none yet", []int{no, no, p}, true, -1},
		{"denied: the first of the last run of denials", []int{ok, ok, no, no, no, no, no, p, p}, false, 2},
		{"denied: too few in a row yet", []int{ok, no, no, no, no, p}, false, -1},
		{"denied: a success after denials starts over", []int{no, no, no, no, no, ok, no}, false, -1},
		{"denied: a longer run counts from its start", []int{ok, no, no, no, no, no, no, no}, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at, done := decided(mk(tc.states...), tc.allowed)
			if tc.want < 0 {
				if done {
					t.Fatalf("decided at %v, want undecided", at.Sub(t0))
				}
				return
			}
			if !done || !at.Equal(t0.Add(time.Duration(tc.want)*time.Millisecond)) {
				t.Fatalf("got %v (decided %v), want attempt %d", at.Sub(t0), done, tc.want)
			}
		})
	}
}

// TestInRunOrder: every state comes first once in as many runs as there
// are states.
func TestInRunOrder(t *testing.T) {
	states := []string{"none", "1000", "cnp1000"}
	firsts := map[string]bool{}
	for run := range len(states) {
		order := inRunOrder(states, run)
		if len(order) != len(states) {
			t.Fatalf("run %d: %v", run, order)
		}
		firsts[order[0]] = true
	}
	if len(firsts) != len(states) {
		t.Fatalf("first states over %d runs: %v", len(states), firsts)
	}
	if got := inRunOrder([]string{"off", "on"}, 1); got[0] != "on" {
		t.Fatalf("two states do not alternate: %v", got)
	}
}

// TestStatePairs: a state row is paired, round by round, with its base
// state's row, and the comparison judges it by that interval.
func TestStatePairs(t *testing.T) {
	rs := newResults()
	for run, v := range []float64{100, 110, 90, 105} {
		rs.addRound(policyPath, "crr_cps_none", "conn/s", "higher", EBPF, run, v)
		rs.addRound(policyPath, "crr_cps_cnp1000", "conn/s", "higher", EBPF, run, v*0.8)
		rs.addRound(policyPath, "crr_cps_1000", "conn/s", "higher", EBPF, run, v*[]float64{1.02, 0.97, 1.01, 0.99}[run])
	}
	rows := rs.Rows()
	var cnp, np *Row
	for i := range rows {
		switch rows[i].Metric {
		case "crr_cps_cnp1000":
			cnp = &rows[i]
		case "crr_cps_1000":
			np = &rows[i]
		}
	}
	p := cnp.Paired[stateKey("cnp1000", "none")]
	if p == nil || p.Rounds != 4 || p.Ratio < 0.799 || p.Ratio > 0.801 || p.Verdict != isWorse {
		t.Fatalf("cnp1000/none: %+v", p)
	}
	if q := np.Paired[stateKey("1000", "none")]; q == nil || q.Verdict != cannotTell {
		t.Fatalf("1000/none: %+v", q)
	}
	out := stateComparison(rows, policyPath, "none", "cnp1000", "1,000 ClusterNetworkPolicies", 0)
	if !strings.Contains(out, "❌ worse") {
		t.Fatalf("a 20%% loss in every round is not worse:\n%s", out)
	}
	out = stateComparison(rows, policyPath, "none", "1000", "1,000 NetworkPolicies", 0)
	if !strings.Contains(out, "≈ within noise") {
		t.Fatalf("±3%% around 1x is not within noise:\n%s", out)
	}
}
