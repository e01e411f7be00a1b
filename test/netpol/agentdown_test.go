package netpol_test

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestAgentDown: with the policy controller stopped, every pair behaves as
// before; a pod started meanwhile in a namespace with ingress and egress
// policies has both directions closed (no policy selects it: it is
// closed because its namespace has policies, until the agent has looked);
// once the controller runs again, it opens within changeBound of the
// start. A pod started meanwhile in a namespace without policies is open
// at once.
func TestAgentDown(t *testing.T) {
	cl := newCluster(t)
	ctl := cl.startController(t)
	cl.change(func() {
		cl.create(
			policyOf("x", "x-a-from-x-b", labels("pod", "a")).ingress(from(podPeer(labels("pod", "b")))).obj(),
			policyOf("x", "x-b-to-y-and-x-a", labels("pod", "b")).egress(to(nsPeer(nsName("y")), podPeer(labels("pod", "a")))).obj(),
		)
	})
	want := allowAll().deny("*", "x/a").deny("x/b", "*").allow("x/b", "y/*").allow("x/b", "x/a")
	checks := []check{tcp(80, want), udp(81, want), sctp(80, want)}
	cl.expect(t, checks, settle)

	ctl.stop(t)
	cl.expect(t, checks, 0)

	d := cl.addPod("x", "d")
	ya := cl.pod("y/a")
	type pair struct {
		from, to *pod
		k        key
	}
	var opening []pair
	for _, fam := range families {
		for _, k := range []key{{TCP, 80, fam}, {UDP, 81, fam}} {
			opening = append(opening, pair{ya, d, k}, pair{d, ya, k})
		}
	}
	// x/a admits x/b only, whatever the agent does for x/d.
	closed := []pair{{d, cl.pod("x/a"), key{TCP, 80, 4}}, {d, cl.pod("x/a"), key{TCP, 80, 6}}}
	// probeAll runs the probes of pairs at once.
	probeAll := func(pairs []pair, timeout time.Duration) []result {
		out := make([]result, len(pairs))
		parallel(len(pairs), func(i int) { out[i] = probe(pairs[i].from, pairs[i].to, pairs[i].k, timeout) })
		return out
	}
	all := append(opening[:len(opening):len(opening)], closed...)
	for i, r := range probeAll(all, retryTimeout) {
		if r.ok {
			t.Errorf("agent stopped: %s %s -> %s reached: the new pod of a namespace with policies must start closed both ways", all[i].k, all[i].from, all[i].to)
		}
	}
	// A pod of a namespace without policies starts open, agent or not.
	zd := cl.addPod("z", "d")
	var open []pair
	for _, fam := range families {
		open = append(open, pair{ya, zd, key{TCP, 80, fam}}, pair{zd, ya, key{UDP, 81, fam}})
	}
	for i, r := range probeAll(open, retryTimeout) {
		if !r.ok {
			t.Errorf("agent stopped: %s %s -> %s: %s: a new pod of a namespace without policies must start open", open[i].k, open[i].from, open[i].to, r.why)
		}
	}
	cl.expect(t, checks, 0)

	start := time.Now()
	cl.startController(t)
	synced := time.Since(start)
	var took time.Duration
	left := opening
	for len(left) > 0 && time.Since(start) < settle {
		var still []pair
		for i, r := range probeAll(left, probeTimeout/2) {
			if !r.ok {
				still = append(still, left[i])
			}
		}
		left = still
		took = time.Since(start)
	}
	if len(left) > 0 {
		var l []string
		for _, p := range left {
			l = append(l, fmt.Sprintf("%s %s -> %s", p.k, p.from, p.to))
		}
		t.Fatalf("%v after the controller started (synced after %v), the new pod is still closed:\n  %s", settle, synced.Round(time.Millisecond), strings.Join(l, "\n  "))
	}
	t.Logf("the new pod opened %v after the controller started (synced after %v)", took.Round(time.Millisecond), synced.Round(time.Millisecond))
	if took > changeBound {
		t.Errorf("the new pod opened %v after the controller started, over %v", took.Round(time.Millisecond), changeBound)
	}
	for i, r := range probeAll(closed, retryTimeout) {
		if r.ok {
			t.Errorf("%s %s -> %s reached: x/a admits x/b only", closed[i].k, closed[i].from, closed[i].to)
		}
	}
	cl.expect(t, checks, 0)
}
