package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// workers is how many requests the harness has in flight while it fills.
const workers = 48

// measure runs the phases in order; a figure that cannot be had is
// reported as failed and the others go on where they can.
func (h *harness) measure(ctx context.Context) error {
	h.loadAvg = loadAvg()
	if err := h.fill(ctx); err != nil {
		return fmt.Errorf("filling the API server: %w", err)
	}
	for i := range h.cfg.agents {
		if _, err := h.addNode(ctx, i); err != nil {
			return err
		}
	}
	h.logf("%d agent nodes made, %d pods attached by the plugin", h.cfg.agents, h.cfg.agents*h.cfg.realPods)
	if err := h.firstSync(ctx); err != nil {
		return err
	}
	if err := h.idle(ctx, "agent_rss_mb_idle", "agent_cpu_cores_idle"); err != nil {
		return err
	}
	if err := h.addPolicies(ctx); err != nil {
		return err
	}
	// From here a phase that fails is reported and the next one runs.
	for _, phase := range []struct {
		name string
		f    func(context.Context) error
	}{{"policy apply", h.policyApply}, {"peer label", h.peerLabel}, {"node routes", h.nodeRoutes}, {"churn", h.churn}} {
		if err := phase.f(ctx); err != nil {
			if ctx.Err() != nil {
				return err
			}
			h.res.fail("%s: %v", phase.name, err)
			h.logf("FAIL %s: %v", phase.name, err)
		}
	}
	return nil
}

// fill writes the namespaces, nodes and pods (with their status).
func (h *harness) fill(ctx context.Context) error {
	t0 := time.Now()
	c := h.client
	if err := parallel(ctx, h.m.namespaces, workers, func(n int) error {
		_, err := c.CoreV1().Namespaces().Create(ctx, h.m.namespace(n), metav1.CreateOptions{})
		return err
	}); err != nil {
		return err
	}
	if err := parallel(ctx, h.m.nodes, workers, func(i int) error {
		_, err := c.CoreV1().Nodes().Create(ctx, h.nodeObject(i), metav1.CreateOptions{})
		return err
	}); err != nil {
		return err
	}
	h.logf("%d namespaces and %d nodes written in %.1fs", h.m.namespaces, h.m.nodes, time.Since(t0).Seconds())
	t0 = time.Now()
	if err := parallel(ctx, h.m.pods, workers, func(k int) error {
		p, err := c.CoreV1().Pods(nsName(h.m.podNS(k))).Create(ctx, h.m.pod(k), metav1.CreateOptions{})
		if err != nil {
			return err
		}
		p.Status = podStatus(h.m.podIP(k))
		_, err = c.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	}); err != nil {
		return err
	}
	h.logf("%d pods written (created, then their status) in %.1fs", h.m.pods, time.Since(t0).Seconds())
	return nil
}

// nodeObject is node i; the agents' nodes have their segment addresses.
func (h *harness) nodeObject(i int) *corev1.Node {
	if i < h.cfg.agents {
		return h.m.node(i, netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)}), netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0xff, 0xff, 15: byte(10 + i)}))
	}
	return h.m.node(i, netip.Addr{}, nodeIP6(i))
}

// ready: the agent answers ready, its policies synced, and it holds a
// tunnel endpoint for every other node.
func (h *harness) ready(a *agentNode) bool {
	if a.tunnels() < h.m.nodes-1 {
		return false
	}
	s := a.status()
	return s != nil && s.Ready && s.Policy != nil && s.Policy.Synced
}

// firstSync starts the first agent alone and times it to complete maps,
// then starts the others and waits for them.
func (h *harness) firstSync(ctx context.Context) error {
	a := h.agents[0]
	if err := h.startAgent(a); err != nil {
		return err
	}
	if err := h.waitFor(ctx, 10*time.Minute, func() bool { return h.ready(a) }); err != nil {
		return fmt.Errorf("%s not ready: %w", a.name, err)
	}
	s := time.Since(a.started).Seconds()
	h.res.set("agent_first_sync_s", s)
	h.logf("first sync: %s ready (%d tunnel endpoints, policies synced) %.2fs after it started", a.name, a.tunnels(), s)
	for _, a := range h.agents[1:] {
		if err := h.startAgent(a); err != nil {
			return err
		}
	}
	t0 := time.Now()
	for _, a := range h.agents {
		if err := h.waitFor(ctx, 15*time.Minute, func() bool { return h.ready(a) }); err != nil {
			return fmt.Errorf("%s not ready: %w", a.name, err)
		}
	}
	h.logf("all %d agents ready (%.1fs after the other agents started at once)", len(h.agents), time.Since(t0).Seconds())
	return nil
}

func (h *harness) waitFor(ctx context.Context, limit time.Duration, ok func() bool) error {
	deadline := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// stats reads every agent's CPU time and RSS.
func (h *harness) stats() ([]procStat, error) {
	var out []procStat
	for _, a := range h.agents {
		s, err := a.stat()
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }

func summary(xs []float64) string {
	return fmt.Sprintf("median %.4g, min %.4g, max %.4g over %d", median(xs), percentile(xs, 0), percentile(xs, 1), len(xs))
}

// idle: the agents at rest after a settling time: RSS now, CPU over
// cfg.idle.
func (h *harness) idle(ctx context.Context, rssRow, cpuRow string) error {
	h.logf("idle: settling 20s, then CPU over %s", h.cfg.idle)
	if err := sleep(ctx, 20*time.Second); err != nil {
		return err
	}
	before, err := h.stats()
	if err != nil {
		return err
	}
	if err := sleep(ctx, h.cfg.idle); err != nil {
		return err
	}
	after, err := h.stats()
	if err != nil {
		return err
	}
	var rss, cpu []float64
	for i := range after {
		rss = append(rss, mb(after[i].rss))
		cpu = append(cpu, (after[i].cpu-before[i].cpu).Seconds()/h.cfg.idle.Seconds())
	}
	h.res.set(rssRow, median(rss))
	h.logf("idle: RSS MB %s", summary(rss))
	if cpuRow != "" {
		h.res.set(cpuRow, median(cpu))
		h.logf("idle: CPU cores %s", summary(cpu))
	} else {
		h.logf("idle with policies: CPU cores %s", summary(cpu))
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// addPolicies writes the NetworkPolicies, waits until every agent's maps
// equal a compilation from scratch, and takes the agents' RSS at rest.
func (h *harness) addPolicies(ctx context.Context) error {
	per := h.m.polPerNS()
	t0 := time.Now()
	if err := parallel(ctx, per*h.m.namespaces, workers, func(i int) error {
		np := h.m.policy(i/per, i%per, 0)
		_, err := h.client.NetworkingV1().NetworkPolicies(np.Namespace).Create(ctx, np, metav1.CreateOptions{})
		return err
	}); err != nil {
		return err
	}
	h.logf("%d policies written in %.1fs; waiting for the agents' maps to equal a compilation from scratch", per*h.m.namespaces, time.Since(t0).Seconds())
	ok, err := h.converge(ctx, 20*time.Minute, "after the policies")
	if err != nil {
		return err
	}
	if ok {
		h.logf("policies: maps equal a compilation from scratch %.1fs after the first write", time.Since(t0).Seconds())
	}
	return h.idle(ctx, "agent_rss_mb_30k_policies", "")
}

// converge waits until every agent's maps equal a compilation from scratch
// (checked every 5 s); past limit it records the difference as a failure
// and returns false.
func (h *harness) converge(ctx context.Context, limit time.Duration, what string) (bool, error) {
	deadline := time.Now().Add(limit)
	for {
		n, first, err := h.checkAll(ctx)
		if err != nil {
			return false, err
		}
		if n == 0 {
			return true, nil
		}
		if time.Now().After(deadline) {
			h.res.fail("maps %s: %d entries differ from a compilation from scratch %s later (%s)", what, n, limit, strings.Join(first, "; "))
			h.logf("maps %s: %d entries still differ: %s", what, n, strings.Join(first, "; "))
			return false, nil
		}
		if err := sleep(ctx, 5*time.Second); err != nil {
			return false, err
		}
	}
}

// poll waits until ok holds, checking every millisecond, and returns when
// it did; zero past limit.
func poll(ctx context.Context, limit time.Duration, ok func() bool) time.Time {
	deadline := time.Now().Add(limit)
	for {
		if ok() {
			return time.Now()
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return time.Time{}
		}
		time.Sleep(time.Millisecond)
	}
}

// changeLimit: a change not in the maps by then counts as this long.
const changeLimit = 60 * time.Second

func (h *harness) latencies(name string, lats []float64, missed int) {
	if missed > 0 {
		h.res.fail("%s: %d of %d changes not in the maps within %s (counted as %s)", name, missed, len(lats), changeLimit, changeLimit)
	}
	h.logf("%s: p50 %.1f ms, p99 %.1f ms, max %.1f ms over %d changes", name, median(lats), percentile(lats, 0.99), percentile(lats, 1), len(lats))
}

// podIP is pod k's address: the plugin's for the pods it attached.
func (h *harness) podIP(k int) netip.Addr {
	for _, a := range h.agents {
		for _, p := range a.pods {
			if p.k == k {
				return p.ip
			}
		}
	}
	return h.m.podIP(k)
}

// policyApply changes one policy at a time (its port), a policy selecting
// a plugin-made pod, and times it from the API write to the entry with the
// new port in that node's policy_rules.
func (h *harness) policyApply(ctx context.Context) error {
	per, perNS := h.m.polPerNS(), h.m.perNS()
	var lats []float64
	missed := 0
	for c := range h.cfg.changes {
		a := h.agents[c%len(h.agents)]
		rp := a.pods[(c/len(h.agents))%len(a.pods)]
		n, j := h.m.podNS(rp.k), h.m.podJ(rp.k)
		var cands []int
		for p := j % 10; p < per; p += 10 {
			if p != 0 {
				cands = append(cands, p)
			}
		}
		if len(cands) == 0 {
			return fmt.Errorf("policy apply: no policy selects pod %d (%d policies per namespace)", rp.k, per)
		}
		p := cands[c%len(cands)]
		port := 10000 + c
		dir, peer := policy.Ingress, netip.Prefix{}
		switch p % 3 {
		case 0:
			peer = netip.PrefixFrom(h.podIP(n*perNS+p%5), 32)
		case 1:
			peer = netip.PrefixFrom(h.podIP(((n+p)%50)*perNS+p%5), 32)
		default:
			dir, peer = policy.Egress, netip.MustParsePrefix("192.0.2.0/24")
		}
		t0 := time.Now()
		if _, err := h.client.NetworkingV1().NetworkPolicies(nsName(n)).Update(ctx, h.m.policy(n, p, port), metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("policy apply: updating %s/%s: %w", nsName(n), polName(p), err)
		}
		t1 := poll(ctx, changeLimit, func() bool { return a.hasPort(rp.ifindex, dir, peer, port) })
		if t1.IsZero() {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			missed++
			t1 = t0.Add(changeLimit)
		}
		lats = append(lats, float64(t1.Sub(t0).Microseconds())/1000)
	}
	h.res.set("policy_apply_p50_ms_30k", median(lats))
	h.res.set("policy_apply_p99_ms_30k", percentile(lats, 0.99))
	h.latencies("policy apply", lats, missed)
	return nil
}

// target is an endpoint whose rules a change must reach.
type target struct {
	a       *agentNode
	ifindex uint32
}

// peerLabel labels a pod into the peers of policy np-00 of its namespace
// (access=granted), then out again, and times each to the maps of every
// agent with a plugin-made pod that np-00 selects (app=a0 of that
// namespace): its entry for the pod allowing TCP 5000, then not.
func (h *harness) peerLabel(ctx context.Context) error {
	if h.m.polPerNS() == 0 {
		return errors.New("peer label: no policies")
	}
	byNS := map[int][]target{}
	var nss []int
	for _, a := range h.agents {
		for _, rp := range a.pods {
			if h.m.podJ(rp.k)%10 != 0 {
				continue
			}
			n := h.m.podNS(rp.k)
			if byNS[n] == nil {
				nss = append(nss, n)
			}
			byNS[n] = append(byNS[n], target{a, rp.ifindex})
		}
	}
	if len(nss) == 0 {
		return errors.New("peer label: no plugin-made pod is selected by a namespace's np-00 (app=a0)")
	}
	real := map[int]bool{}
	for _, a := range h.agents {
		for _, rp := range a.pods {
			real[rp.k] = true
		}
	}
	var lats []float64
	missed := 0
	for c := range h.cfg.changes {
		n := nss[(c/2)%len(nss)]
		// A pod of n no agent has (its labels are the API server's only).
		var k int
		for j := 1 + (c/2/len(nss))%h.m.perNS(); ; j++ {
			if k = n*h.m.perNS() + j%h.m.perNS(); !real[k] {
				break
			}
		}
		in := c%2 == 0
		var patch string
		if in {
			patch = fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, grantLabel, grantValue)
		} else {
			patch = fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, grantLabel)
		}
		peer := netip.PrefixFrom(h.podIP(k), 32)
		t0 := time.Now()
		if _, err := h.client.CoreV1().Pods(nsName(n)).Patch(ctx, podName(k), types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("peer label: patching %s/%s: %w", nsName(n), podName(k), err)
		}
		t1 := poll(ctx, changeLimit, func() bool {
			for _, t := range byNS[n] {
				if t.a.hasPort(t.ifindex, policy.Ingress, peer, grantPort) != in {
					return false
				}
			}
			return true
		})
		if t1.IsZero() {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			missed++
			t1 = t0.Add(changeLimit)
		}
		lats = append(lats, float64(t1.Sub(t0).Microseconds())/1000)
	}
	h.res.set("peer_label_p99_ms", percentile(lats, 0.99))
	h.latencies("peer label", lats, missed)
	return nil
}

// nodeRoutes adds nodes, then replaces nodes with ones of a new pod range
// (a Node's podCIDRs cannot change in place: the node is deleted and
// registers again with the new one), and times each from the write to the
// tunnel endpoint on every agent.
func (h *harness) nodeRoutes(ctx context.Context) error {
	var lats []float64
	missed := 0
	half := h.cfg.changes / 2
	for c := range h.cfg.changes {
		var nd *corev1.Node
		var cidr netip.Prefix
		var t0 time.Time
		if c < half {
			i := h.m.nodes + c
			nd, cidr = h.nodeObject(i), podCIDR(i)
			t0 = time.Now()
		} else {
			i := h.cfg.agents + (c - half)
			nd, cidr = h.nodeObject(i), podCIDR(1536+c-half)
			nd.Spec.PodCIDR, nd.Spec.PodCIDRs = cidr.String(), []string{cidr.String()}
			t0 = time.Now()
			if err := h.client.CoreV1().Nodes().Delete(ctx, nd.Name, metav1.DeleteOptions{}); err != nil {
				return fmt.Errorf("node routes: deleting %s: %w", nd.Name, err)
			}
		}
		if _, err := h.client.CoreV1().Nodes().Create(ctx, nd, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("node routes: creating %s: %w", nd.Name, err)
		}
		via := nodeIP6(0)
		for _, a := range nd.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				via = netip.MustParseAddr(a.Address)
			}
		}
		t1 := poll(ctx, changeLimit, func() bool {
			for _, a := range h.agents {
				if a.tunnel(cidr) != via {
					return false
				}
			}
			return true
		})
		if t1.IsZero() {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			missed++
			t1 = t0.Add(changeLimit)
		}
		lats = append(lats, float64(t1.Sub(t0).Microseconds())/1000)
	}
	h.res.set("node_routes_p99_ms", percentile(lats, 0.99))
	h.latencies("node routes", lats, missed)
	return nil
}

// churn creates cfg.churnRate pods a second cluster-wide (status with an
// address written, as a kubelet does) and deletes each a second later, for
// cfg.churnFor; it takes the agents' CPU over that time and the bytes each
// was sent per pod write, then checks the maps against a compilation from
// scratch.
func (h *harness) churn(ctx context.Context) error {
	type job struct {
		k      int
		delete bool
	}
	jobs := make(chan job, 4*h.cfg.churnRate)
	var writes, errs atomic.Int64
	var wg sync.WaitGroup
	rng := rand.New(rand.NewPCG(1, 2))
	nodes := make([]int, 0)
	for k := 0; k < int(h.cfg.churnFor.Seconds())*h.cfg.churnRate+h.cfg.churnRate; k++ {
		nodes = append(nodes, rng.IntN(h.m.nodes))
	}
	churnPod := func(k int) *corev1.Pod {
		n := k % h.m.namespaces
		p := h.m.pod(n * h.m.perNS())
		p.Name = fmt.Sprintf("churn-%06d", k)
		p.Labels = podLabels(k % h.m.perNS())
		p.Spec.NodeName = nodeName(nodes[k])
		return p
	}
	churnIP := func(k int) netip.Addr {
		b := podCIDR(nodes[k]).Addr().As4()
		b[3] = byte(100 + k%150)
		return netip.AddrFrom4(b)
	}
	zero := int64(0)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				p := churnPod(j.k)
				var err error
				if j.delete {
					err = h.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
					if err == nil {
						writes.Add(1)
					}
				} else {
					var made *corev1.Pod
					if made, err = h.client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err == nil {
						writes.Add(1)
						made.Status = podStatus(churnIP(j.k))
						if _, err = h.client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, made, metav1.UpdateOptions{}); err == nil {
							writes.Add(1)
						}
					}
				}
				if err != nil && ctx.Err() == nil {
					if errs.Add(1) <= 3 {
						h.logf("churn: %v", err)
					}
				}
			}
		}()
	}
	before, err := h.stats()
	if err != nil {
		return err
	}
	bytesBefore := make([]int64, len(h.agents))
	for i, a := range h.agents {
		bytesBefore[i] = a.proxy.down.Load()
	}
	h.logf("churn: %d pod creations and deletions a second for %s", h.cfg.churnRate, h.cfg.churnFor)
	t0 := time.Now()
	tick := time.NewTicker(time.Second / time.Duration(h.cfg.churnRate))
	k := 0
	late := 0
	for time.Since(t0) < h.cfg.churnFor && ctx.Err() == nil {
		<-tick.C
		select {
		case jobs <- job{k: k}:
		default:
			late++
			jobs <- job{k: k}
		}
		if k >= h.cfg.churnRate {
			jobs <- job{k: k - h.cfg.churnRate, delete: true}
		}
		k++
	}
	tick.Stop()
	for d := max(0, k-h.cfg.churnRate); d < k; d++ {
		jobs <- job{k: d, delete: true}
	}
	close(jobs)
	wg.Wait()
	elapsed := time.Since(t0)
	after, err := h.stats()
	if err != nil {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var cpu, per []float64
	w := writes.Load()
	for i, a := range h.agents {
		cpu = append(cpu, (after[i].cpu-before[i].cpu).Seconds()/elapsed.Seconds())
		per = append(per, float64(a.proxy.down.Load()-bytesBefore[i])/float64(max(w, 1)))
	}
	h.res.set("churn_agent_cpu_cores", median(cpu))
	h.res.set("watch_bytes_per_pod_change", median(per))
	h.logf("churn: %d pods made and deleted, %d pod writes in %.1fs (%.0f/s), %d failed, %d ticks behind", k, w, elapsed.Seconds(), float64(w)/elapsed.Seconds(), errs.Load(), late)
	h.logf("churn: agent CPU cores %s", summary(cpu))
	h.logf("churn: bytes sent to an agent per pod write %s", summary(per))
	if errs.Load() > 0 {
		h.res.notes = append(h.res.notes, fmt.Sprintf("churn: %d of its API writes failed", errs.Load()))
	}
	h.res.notes = append(h.res.notes, fmt.Sprintf("churn achieved %.0f pod writes/s (create, status, delete)", float64(w)/elapsed.Seconds()))
	t1 := time.Now()
	ok, err := h.converge(ctx, 5*time.Minute, "after the churn")
	if ok {
		h.logf("churn: every agent's maps equal a compilation from scratch (%.1fs after the churn)", time.Since(t1).Seconds())
	}
	return err
}
