package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	cnpfake "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned/fake"
)

// Enforce and revoke latency: from the API write of a policy change to
// the first connection that sees it, for each kind of policy, with the
// policy path's API (1,000 pods, 1,000 NetworkPolicies and 1,000
// ClusterNetworkPolicies). Each cycle opens the probe's port between the
// kind's pair (enforce: the first new connection that succeeds), opens a
// connection that stays, then closes the port again (enforce: the first
// new connection that no longer succeeds; revoke: the first request of
// the established connection that gets no answer). The probe's policy of
// each kind is the change:
//   - NetworkPolicy: "probe" of bench-policy admits the pair to each other
//     on probePort (open) or on probePort+1, where nothing listens
//     (closed: the established flow loses its allow);
//   - ClusterNetworkPolicy: "cnp-probe" of the Admin tier, at priority 1,
//     Accepts (open) or Denies (closed) the pair to each other on
//     probePort, above 998 policies of both tiers and a Baseline that
//     denies the pair everything else.

// probePort is where the pairs' servers answer the probes.
const probePort = echoPort + 1

// probeEvery is how often a probe starts a new connection or sends a
// request. An attempt unanswered for probeLost (a round trip between two
// pods of a node is tens of microseconds) is the moment a change was seen
// once it stays unanswered for probeConfirm: a dropped SYN or request is
// sent again only after a second or 200 ms, so an answer before then was
// merely late (a loaded machine), not denied. probeDenied attempts in a
// row must be denied before the first of them counts.
const (
	probeEvery   = time.Millisecond
	probeLost    = 30 * time.Millisecond
	probeConfirm = 150 * time.Millisecond
	probeDenied  = 5
	probeLimit   = 10 * time.Second
)

// latencyKinds are the kinds measured, in the rows' suffix.
var latencyKinds = []string{"np", "cnp"}

// latencyMetrics are each kind's rows.
var latencyMetrics = []string{"enforce_p50_ms", "enforce_p99_ms", "revoke_p50_ms", "revoke_p99_ms"}

// cnpSelector is a label selector of one label.
func cnpSelector(k, v string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{k: v}}
}

// cnpPair is bench-cnp's pair, as a subject or a peer.
func cnpPair() *cnpv1.NamespacedPod {
	return &cnpv1.NamespacedPod{NamespaceSelector: *cnpSelector("kubernetes.io/metadata.name", "bench-cnp"), PodSelector: *cnpSelector("pair", "yes")}
}

// cnpRule is a rule of both directions: action for peer on TCP port.
func cnpRule(p *cnpv1.ClusterNetworkPolicy, action cnpv1.ClusterNetworkPolicyRuleAction, peer *cnpv1.NamespacedPod, port int32) {
	var protos []cnpv1.ClusterNetworkPolicyProtocol
	if port > 0 {
		protos = []cnpv1.ClusterNetworkPolicyProtocol{{TCP: &cnpv1.ClusterNetworkPolicyProtocolTCP{DestinationPort: &cnpv1.Port{Number: port}}}}
	}
	in := cnpv1.ClusterNetworkPolicyIngressRule{Action: action, Protocols: protos, From: []cnpv1.ClusterNetworkPolicyIngressPeer{{Pods: peer}}}
	out := cnpv1.ClusterNetworkPolicyEgressRule{Action: action, Protocols: protos, To: []cnpv1.ClusterNetworkPolicyEgressPeer{{Pods: peer}}}
	if peer == nil { // every namespace
		in.From = []cnpv1.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{}}}
		out.To = []cnpv1.ClusterNetworkPolicyEgressPeer{{Namespaces: &metav1.LabelSelector{}}}
	}
	p.Spec.Ingress = append(p.Spec.Ingress, in)
	p.Spec.Egress = append(p.Spec.Egress, out)
}

// newCNP is a ClusterNetworkPolicy of tier at prio selecting bench-cnp's
// pair.
func newCNP(name string, tier cnpv1.Tier, prio int32) *cnpv1.ClusterNetworkPolicy {
	p := &cnpv1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}}
	p.Spec.Tier, p.Spec.Priority = tier, prio
	p.Spec.Subject = cnpv1.ClusterNetworkPolicySubject{Pods: cnpPair()}
	return p
}

// benchCNP is ClusterNetworkPolicy i of the policyCount that select
// bench-cnp's pair: 0 Accepts the pair to each other on echoPort (Admin,
// first); the last denies the pair everything (Baseline, last); the others
// alternate between an Admin Deny and a Baseline Accept of one peer on a
// port of its own, both ways.
func benchCNP(i int) *cnpv1.ClusterNetworkPolicy {
	name := fmt.Sprintf("cnp-%d", i)
	switch {
	case i == 0:
		p := newCNP(name, cnpv1.AdminTier, 0)
		cnpRule(p, cnpv1.ClusterNetworkPolicyRuleActionAccept, cnpPair(), echoPort)
		return p
	case i == policyCount-1:
		p := newCNP(name, cnpv1.BaselineTier, int32(i))
		cnpRule(p, cnpv1.ClusterNetworkPolicyRuleActionDeny, nil, 0)
		return p
	}
	tier, action := cnpv1.AdminTier, cnpv1.ClusterNetworkPolicyRuleActionDeny
	if i%2 == 1 {
		tier, action = cnpv1.BaselineTier, cnpv1.ClusterNetworkPolicyRuleActionAccept
	}
	p := newCNP(name, tier, int32(i))
	peer := &cnpv1.NamespacedPod{NamespaceSelector: *cnpSelector("kubernetes.io/metadata.name", "bench-peers"), PodSelector: *cnpSelector("peer", fmt.Sprint(i%policyPeers))}
	cnpRule(p, action, peer, int32(1000+i))
	return p
}

// probeCNP is the probe's ClusterNetworkPolicy, open or closed.
func probeCNP(open bool) *cnpv1.ClusterNetworkPolicy {
	action := cnpv1.ClusterNetworkPolicyRuleActionDeny
	if open {
		action = cnpv1.ClusterNetworkPolicyRuleActionAccept
	}
	p := newCNP("cnp-probe", cnpv1.AdminTier, 1)
	cnpRule(p, action, cnpPair(), probePort)
	return p
}

// probeNP is the probe's NetworkPolicy, open or closed.
func probeNP(open bool) *networkingv1.NetworkPolicy {
	port := intstr.FromInt32(probePort + 1)
	if open {
		port = intstr.FromInt32(probePort)
	}
	tcp := corev1.ProtocolTCP
	pair := &metav1.LabelSelector{MatchLabels: map[string]string{"pair": "yes"}}
	ports := []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}}
	peers := []networkingv1.NetworkPolicyPeer{{PodSelector: pair}}
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "bench-policy", Name: "probe"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: *pair, PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: peers, Ports: ports}},
			Egress:  []networkingv1.NetworkPolicyEgressRule{{To: peers, Ports: ports}}}}
}

// fakeCNPAPI is a fake API server serving ClusterNetworkPolicies, holding
// the policyCount of benchCNP and the probe's, closed.
func fakeCNPAPI() (*cnpfake.Clientset, error) {
	client := cnpfake.NewSimpleClientset()
	client.Resources = []*metav1.APIResourceList{{GroupVersion: cnpv1.GroupVersion.String(),
		APIResources: []metav1.APIResource{{Name: "clusternetworkpolicies", Kind: "ClusterNetworkPolicy"}}}}
	for i := range policyCount {
		if _, err := client.PolicyV1beta1().ClusterNetworkPolicies().Create(context.Background(), benchCNP(i), metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("the fake API: %w", err)
		}
	}
	if _, err := client.PolicyV1beta1().ClusterNetworkPolicies().Create(context.Background(), probeCNP(false), metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("the fake API: %w", err)
	}
	return client, nil
}

// latencyProbe is what one kind's cycles need: its pair and the write that
// opens or closes the probe's port.
type latencyProbe struct {
	kind           string
	client, server *pod
	write          func(open bool) error
}

// latencyProbes are the probes of both kinds on the policy path's API.
func latencyProbes(pods map[string]*pod, client *fake.Clientset, cnps *cnpfake.Clientset) []latencyProbe {
	return []latencyProbe{
		{"np", pods["pol-client"], pods["pol-server"], func(open bool) error {
			_, err := client.NetworkingV1().NetworkPolicies("bench-policy").Update(context.Background(), probeNP(open), metav1.UpdateOptions{})
			return err
		}},
		{"cnp", pods["cnp-client"], pods["cnp-server"], func(open bool) error {
			_, err := cnps.PolicyV1beta1().ClusterNetworkPolicies().Update(context.Background(), probeCNP(open), metav1.UpdateOptions{})
			return err
		}},
	}
}

// policyLatency measures both kinds' enforce and revoke latency over
// cycles cycles each: 2 enforce figures and 1 revoke figure per cycle.
func (b *bench) policyLatency(probes []latencyProbe, cycles int) error {
	for _, k := range latencyKinds {
		for _, m := range latencyMetrics {
			b.res.declare(policyPath, m+"_"+k, "ms", "lower")
			b.res.skip(policyPath, m+"_"+k, "ms", "lower", REF, "not applicable: REF enforces no NetworkPolicy")
			b.res.skip(policyPath, m+"_"+k, "ms", "lower", RAW, "not applicable: no NetworkPolicy")
		}
	}
	for _, p := range probes {
		l, err := probeServer(p.server.ns, addr(p.server.ip, probePort))
		if err != nil {
			return err
		}
		defer l.Close()
		var opened, closed, cut []float64
		for c := range cycles {
			o, cl, r, err := p.cycle()
			if err != nil {
				return fmt.Errorf("policy latency, %s cycle %d: %w", p.kind, c, err)
			}
			opened, closed, cut = append(opened, o), append(closed, cl), append(cut, r)
		}
		enforce := append(append([]float64(nil), opened...), closed...)
		for m, xs := range map[string][]float64{"enforce": enforce, "revoke": cut} {
			b.res.add(policyPath, m+"_p50_ms_"+p.kind, "ms", "lower", EBPF, percentile(xs, 0.5))
			b.res.add(policyPath, m+"_p99_ms_"+p.kind, "ms", "lower", EBPF, percentile(xs, 0.99))
		}
		b.logf("  policy latency %s over %d cycles: a new connection allowed p50 %.1f p99 %.1f ms; denied p50 %.1f p99 %.1f ms; an established flow cut p50 %.1f p99 %.1f ms",
			p.kind, cycles, percentile(opened, 0.5), percentile(opened, 0.99), percentile(closed, 0.5), percentile(closed, 0.99), percentile(cut, 0.5), percentile(cut, 0.99))
	}
	return nil
}

// cycle opens the probe's port and closes it again: the milliseconds from
// the opening write to the first new connection that succeeds, from the
// closing write to the first of the new connections that no longer do, and
// to the first request of a connection opened in between that gets no
// answer.
func (p latencyProbe) cycle() (opened, closed, cut float64, err error) {
	target := netip.AddrPortFrom(netip.MustParseAddr(p.server.ip.String()), probePort)
	t0 := time.Now()
	if err := p.write(true); err != nil {
		return 0, 0, 0, fmt.Errorf("opening the probe's port: %w", err)
	}
	seen, err := firstConnect(p.client.ns, target, true)
	if err != nil {
		return 0, 0, 0, err
	}
	opened = ms(seen.Sub(t0))
	conn, err := dialIn(p.client.ns, target)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("the established connection: %w", err)
	}
	defer conn.Close()
	if _, err := request(conn, time.Second); err != nil {
		return 0, 0, 0, fmt.Errorf("the established connection before the change: %w", err)
	}
	t1 := time.Now()
	if err := p.write(false); err != nil {
		return 0, 0, 0, fmt.Errorf("closing the probe's port: %w", err)
	}
	cutAt := make(chan error, 1)
	var cutSeen time.Time
	go func() {
		var err error
		cutSeen, err = firstLost(conn)
		cutAt <- err
	}()
	seen, err = firstConnect(p.client.ns, target, false)
	if err2 := <-cutAt; err == nil {
		err = err2
	}
	if err != nil {
		return 0, 0, 0, err
	}
	return opened, ms(seen.Sub(t1)), ms(cutSeen.Sub(t1)), nil
}

// probeServer echoes every connection to addr inside n, each on a
// goroutine of its own (the bench tool's server serves one at a time, and
// an established connection the change cut stays open on its side):
// closing the listener stops it.
func probeServer(n ns.NetNS, addr string) (net.Listener, error) {
	var l net.Listener
	if err := n.Do(func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		return nil, fmt.Errorf("the probe's server on %s: %w", addr, err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return l, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// dialIn connects to target from inside n.
func dialIn(n ns.NetNS, target netip.AddrPort) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func(ns.NetNS) error {
		var err error
		c, err = net.DialTimeout("tcp", target.String(), time.Second)
		return err
	})
	return c, err
}

// request sends one byte on c and reads the echo, wait at most.
func request(c net.Conn, wait time.Duration) (time.Time, error) {
	at := time.Now()
	if err := c.SetDeadline(at.Add(wait)); err != nil {
		return at, err
	}
	if _, err := c.Write([]byte{'x'}); err != nil {
		return at, err
	}
	var buf [1]byte
	_, err := c.Read(buf[:])
	return at, err
}

// firstLost sends a request every probeEvery until one gets no answer
// within probeLost that does not come within probeConfirm either: when it
// was sent.
func firstLost(c net.Conn) (time.Time, error) {
	deadline := time.Now().Add(probeLimit)
	for time.Now().Before(deadline) {
		at, err := request(c, probeLost)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			// Late or lost: the echo of this byte may still come.
			if err := c.SetDeadline(at.Add(probeConfirm)); err != nil {
				return at, err
			}
			var buf [1]byte
			_, err = c.Read(buf[:])
			if errors.As(err, &ne) && ne.Timeout() {
				return at, nil
			}
		}
		if err != nil {
			return at, fmt.Errorf("the established connection: %w", err)
		}
		time.Sleep(time.Until(at.Add(probeEvery)))
	}
	return time.Time{}, fmt.Errorf("the established connection was still answered %s after the change", probeLimit)
}

// attempt is one non-blocking connect of firstConnect.
type attempt struct {
	fd    int
	start time.Time
	state int // attemptPending, attemptOK, attemptDenied
}

const (
	attemptPending = iota
	attemptOK
	attemptDenied
)

// firstConnect starts a connection to target from inside n every
// probeEvery and says when the first one that sees the change started:
// with allowed, the first that succeeds; else the first of probeDenied in
// a row that get no answer within probeConfirm (one that succeeds after
// them starts the count again). The connects are non-blocking sockets made on
// one thread in n, polled together, so one that hangs delays no other.
func firstConnect(n ns.NetNS, target netip.AddrPort, allowed bool) (time.Time, error) {
	var seen time.Time
	err := n.Do(func(ns.NetNS) error {
		var atts []*attempt
		defer func() {
			for _, a := range atts {
				if a.fd >= 0 {
					unix.Close(a.fd)
				}
			}
		}()
		deadline := time.Now().Add(probeLimit)
		next := time.Now()
		for time.Now().Before(deadline) {
			if now := time.Now(); !now.Before(next) {
				a, err := connectNB(target)
				if err != nil {
					return err
				}
				atts = append(atts, a)
				next = now.Add(probeEvery)
			}
			if err := pollAttempts(atts, time.Until(next)); err != nil {
				return err
			}
			if at, ok := decided(atts, allowed); ok {
				seen = at
				return nil
			}
		}
		what := "allowed"
		if !allowed {
			what = "denied"
		}
		return fmt.Errorf("no new connection to %s was %s within %s of the change", target, what, probeLimit)
	})
	return seen, err
}

// connectNB starts a non-blocking connect to target.
func connectNB(target netip.AddrPort) (*attempt, error) {
	family, sa := unix.AF_INET, unix.Sockaddr(&unix.SockaddrInet4{Port: int(target.Port()), Addr: target.Addr().As4()})
	if target.Addr().Is6() && !target.Addr().Is4In6() {
		family, sa = unix.AF_INET6, &unix.SockaddrInet6{Port: int(target.Port()), Addr: target.Addr().As16()}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("a probe's socket: %w", err)
	}
	a := &attempt{fd: fd, start: time.Now()}
	if err := unix.Connect(fd, sa); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		unix.Close(fd)
		return nil, fmt.Errorf("a probe's connect to %s: %w", target, err)
	}
	return a, nil
}

// pollAttempts waits up to wait for the pending attempts, then settles
// those that connected, failed, or waited past probeConfirm.
func pollAttempts(atts []*attempt, wait time.Duration) error {
	var fds []unix.PollFd
	var pending []*attempt
	for _, a := range atts {
		if a.state == attemptPending {
			fds = append(fds, unix.PollFd{Fd: int32(a.fd), Events: unix.POLLOUT})
			pending = append(pending, a)
		}
	}
	if len(fds) > 0 {
		// Ppoll, not Poll: a wait under a millisecond would round to
		// a busy loop that takes a CPU from the agent measured.
		ts := unix.NsecToTimespec(max(wait, 0).Nanoseconds())
		if _, err := unix.Ppoll(fds, &ts, nil); err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("polling the probes: %w", err)
		}
	} else if wait > 0 {
		time.Sleep(wait)
	}
	now := time.Now()
	for i, a := range pending {
		switch {
		case fds[i].Revents&(unix.POLLOUT|unix.POLLERR|unix.POLLHUP) != 0:
			soErr, err := unix.GetsockoptInt(a.fd, unix.SOL_SOCKET, unix.SO_ERROR)
			if err == nil && soErr == 0 {
				a.state = attemptOK
			} else {
				// Refused or reset: the server's kernel answered, so
				// the policy let the SYN through; nothing here should
				// refuse.
				return fmt.Errorf("a probe's connect failed: %w", unix.Errno(soErr))
			}
		case now.Sub(a.start) > probeConfirm:
			a.state = attemptDenied
		default:
			continue
		}
		unix.Close(a.fd)
		a.fd = -1
	}
	return nil
}

// decided says when the first attempt that saw the change started, once
// it is known (see firstConnect).
func decided(atts []*attempt, allowed bool) (time.Time, bool) {
	if allowed {
		// The first that succeeded, once none started before it is
		// still pending.
		for _, a := range atts {
			switch a.state {
			case attemptPending:
				return time.Time{}, false
			case attemptOK:
				return a.start, true
			}
		}
		return time.Time{}, false
	}
	// The first of the last probeDenied settled attempts, all denied.
	run := 0
	for i := len(atts) - 1; i >= 0; i-- {
		switch atts[i].state {
		case attemptPending:
			run = 0
			continue
		case attemptOK:
			return time.Time{}, false
		}
		run++
		if run == probeDenied {
			first := i
			for first > 0 && atts[first-1].state == attemptDenied {
				first--
			}
			return atts[first].start, true
		}
	}
	return time.Time{}, false
}

// The bounds (57): enforce p99 at most 50 ms, revoke p99 at most
// 100 ms, for each kind.
const (
	enforceBoundMs = 50
	revokeBoundMs  = 100
)

// latencySection is the report's table of the enforce and revoke rows, by
// kind, against their bounds.
func latencySection(rows []Row) string {
	got := map[string]*float64{}
	for _, r := range rows {
		if r.Path == policyPath {
			got[r.Metric] = r.EBPF
		}
	}
	var b strings.Builder
	b.WriteString("| kind | enforce p50 | enforce p99 | revoke p50 | revoke p99 | bounds (p99) |\n| --- | ---: | ---: | ---: | ---: | --- |\n")
	found := false
	for _, k := range latencyKinds {
		c := func(m string) string { return cell(got[m+"_"+k]) }
		ok := func(m string, bound float64) bool { v := got[m+"_"+k]; return v != nil && *v <= bound }
		if got["enforce_p99_ms_"+k] == nil {
			continue
		}
		found = true
		verdict := "✅ within"
		if !ok("enforce_p99_ms", enforceBoundMs) || !ok("revoke_p99_ms", revokeBoundMs) {
			verdict = "❌ over"
		}
		name := map[string]string{"np": "NetworkPolicy", "cnp": "ClusterNetworkPolicy"}[k]
		fmt.Fprintf(&b, "| %s | %s ms | %s ms | %s ms | %s ms | %s (enforce ≤ %d ms, revoke ≤ %d ms) |\n", name,
			c("enforce_p50_ms"), c("enforce_p99_ms"), c("revoke_p50_ms"), c("revoke_p99_ms"), verdict, enforceBoundMs, revokeBoundMs)
	}
	if !found {
		return ""
	}
	b.WriteString("\nenforce: from the API write to the first new connection that sees it (allowed after the port opens, denied after it closes); revoke: to the first request of a connection established before the close that gets no answer. One connection attempt or request every 1 ms; an attempt is denied when unanswered for 150 ms (a dropped SYN or request is sent again only after 1 s or 200 ms), and 5 in a row must be.\n\n")
	return b.String()
}
