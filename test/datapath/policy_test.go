package datapath_test

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/nodetest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// policyMaps opens the node's NetworkPolicy maps; closed at cleanup.
func (e *env) policyMaps() *policy.Maps {
	e.t.Helper()
	pm, err := policy.Open(nodetest.Handle(e.t, e.bpfRoot, e.stateDir))
	require.NoError(e.t, err)
	e.t.Cleanup(pm.Close)
	return pm
}

// reaches says whether a TCP connection from n to ip:port completes and
// echoes within 5 s; blocked, whether it does not within a second (a
// denied SYN is dropped silently: the client retransmits until it gives
// up). Both work on a slow guest kernel (make test-kernel under TCG).
func reaches(n ns.NetNS, ip net.IP, port int) bool { return connects(n, ip, port, 5*time.Second) }

func blocked(n ns.NetNS, ip net.IP, port int) bool { return !connects(n, ip, port, time.Second) }

func connects(n ns.NetNS, ip net.IP, port int, limit time.Duration) bool {
	var c net.Conn
	err := n.Do(func(ns.NetNS) error {
		var err error
		c, err = net.DialTimeout("tcp", net.JoinHostPort(ip.String(), fmt.Sprint(port)), limit)
		return err
	})
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(limit))
	return nettest.Echo(c, "policy\n") == nil
}

// policyPair starts pods a and b of namespace web on a new node, with the
// node's NetworkPolicy maps.
func policyPair(t *testing.T) (e *env, list *libcni.NetworkConfigList, pm *policy.Maps, a, b *nettest.Pod) {
	e = newEnv(t)
	list = e.confList(netOpts{})
	pm = e.policyMaps()
	a = e.addK8sPod(list, "pol-a", "web", "a")
	b = e.addK8sPod(list, "pol-b", "web", "b")
	return e, list, pm, a, b
}

// hostPrefix is ip as a /32 or /128.
func hostPrefix(ip net.IP) netip.Prefix {
	a, _ := netip.AddrFromSlice(ip)
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen())
}

func tcpRule(first, last uint16) policy.Rule {
	r := policy.Rule{N_ports: 1}
	r.Ports[0] = maps.CniPolicyPort{First: first, Last: last, Proto: 6}
	return r
}

// The datapath under NetworkPolicy maps written by hand (what the agent
// writes; its compiler is tested in pkg/policy and pkg/agent): a closed
// direction denies everything but the node's own traffic, an enforced one
// what its rules allow (peer and port), replies of allowed flows pass, a
// change of rules (new generation) applies to established flows too, the
// denials are counted under their reason and per endpoint; ADD of a pod of
// a namespace with policies starts it closed; DEL leaves no state.
func TestPolicyDatapath(t *testing.T) {
	e, list, pm, a, b := policyPair(t)
	ib := uint32(e.hostIndex(b))
	ia := uint32(e.hostIndex(a))
	for _, fam := range []int{4, 6} {
		for _, port := range []int{80, 81} {
			l, err := nettest.ListenPort(b.NS, b.IP(fam), port)
			require.NoError(t, err)
			t.Cleanup(func() { l.Close() })
		}
	}
	on, err := pm.Active()
	require.NoError(t, err)
	require.False(t, on, "policy lookups on without any policy")
	for _, fam := range []int{4, 6} {
		require.True(t, reaches(a.NS, b.IP(fam), 80), "IPv%d a -> b:80 without policy", fam)
	}

	// Closed: nothing from a; the node's own connections still pass.
	require.NoError(t, pm.SetEndpoint(ib, policy.EndpointState{Ingress: uint8(policy.StateClosed)}))
	before := e.counters()[int(maps.CniPktReasonREASON_DROP_POLICY_INGRESS)]
	for _, fam := range []int{4, 6} {
		require.True(t, blocked(a.NS, b.IP(fam), 80), "IPv%d a -> b:80 with b's ingress closed", fam)
		require.True(t, reaches(e.node.NS, b.IP(fam), 80), "IPv%d node -> b:80 with b's ingress closed", fam)
		out, err := nettest.Ping(b.NS, a.IP(fam), 1)
		require.NoError(t, err, "IPv%d b -> a with b's ingress closed (egress open, replies pass): %s", fam, out)
	}
	require.Greater(t, e.counters()[int(maps.CniPktReasonREASON_DROP_POLICY_INGRESS)], before, "ingress policy drops not counted")
	drops, err := pm.Drops(ib, policy.Ingress)
	require.NoError(t, err)
	require.NotZero(t, drops, "policy_drops of b's ingress")

	// Enforced: a may reach tcp/80 only.
	var entries []policy.Entry
	for _, fam := range []int{4, 6} {
		entries = append(entries, policy.Entry{Prefix: hostPrefix(a.IP(fam)), Rule: tcpRule(80, 80)})
	}
	require.NoError(t, pm.PutRules(ib, policy.Ingress, entries))
	require.NoError(t, pm.SetEndpoint(ib, policy.EndpointState{Ingress: uint8(policy.StateEnforce), IngressGen: 1}))
	for _, fam := range []int{4, 6} {
		require.True(t, reaches(a.NS, b.IP(fam), 80), "IPv%d a -> b:80 allowed by b's rules", fam)
		require.True(t, blocked(a.NS, b.IP(fam), 81), "IPv%d a -> b:81 not in b's rules", fam)
		_, err := nettest.Ping(a.NS, b.IP(fam), 1)
		require.Error(t, err, "IPv%d ping a -> b: ICMP needs a rule without ports", fam)
	}

	// A connection open under generation 1 is decided again under 2.
	c, err := nettest.Dial(a.NS, net.JoinHostPort(b.IP(4).String(), "80"))
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, nettest.Echo(c, "before\n"))
	require.NoError(t, pm.PutRules(ib, policy.Ingress, []policy.Entry{{Prefix: hostPrefix(a.IP(4)), Rule: tcpRule(81, 81)}}))
	require.NoError(t, pm.SetEndpoint(ib, policy.EndpointState{Ingress: uint8(policy.StateEnforce), IngressGen: 2}))
	_ = c.SetDeadline(time.Now().Add(time.Second))
	require.Error(t, nettest.Echo(c, "after\n"), "an established flow kept passing after its rule went")
	require.True(t, reaches(a.NS, b.IP(4), 81), "a -> b:81 allowed by generation 2")

	// Ranges: 80-81 from the whole pod range.
	all := []policy.Entry{{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Rule: tcpRule(80, 81)}}
	require.NoError(t, pm.PutRules(ib, policy.Ingress, all))
	require.NoError(t, pm.DeleteRules(ib, policy.Ingress, []netip.Prefix{hostPrefix(a.IP(4)), hostPrefix(a.IP(6))}))
	require.NoError(t, pm.SetEndpoint(ib, policy.EndpointState{Ingress: uint8(policy.StateEnforce), IngressGen: 3}))
	require.True(t, reaches(a.NS, b.IP(4), 80), "a -> b:80 by 10.0.0.0/8 tcp/80-81")
	require.True(t, reaches(a.NS, b.IP(4), 81), "a -> b:81 by 10.0.0.0/8 tcp/80-81")
	require.True(t, blocked(a.NS, b.IP(6), 80), "IPv6 a -> b:80: no IPv6 rule")

	// Egress of a, enforced without rules: denied on a's side.
	require.NoError(t, pm.SetEndpoint(ia, policy.EndpointState{Egress: uint8(policy.StateEnforce), EgressGen: 1}))
	before = e.counters()[int(maps.CniPktReasonREASON_DROP_POLICY_EGRESS)]
	require.True(t, blocked(a.NS, b.IP(4), 80), "a -> b:80 with a's egress enforced and empty")
	require.Greater(t, e.counters()[int(maps.CniPktReasonREASON_DROP_POLICY_EGRESS)], before, "egress policy drops not counted")
	// The LRU may evict one direction's decision alone: the other's
	// still tells a reply (b's answers to a, whose ingress admits
	// nobody) from a new flow.
	require.NoError(t, pm.PutRules(ia, policy.Egress, []policy.Entry{{Prefix: hostPrefix(b.IP(4)), Rule: tcpRule(80, 80)}}))
	require.NoError(t, pm.SetEndpoint(ia, policy.EndpointState{Egress: uint8(policy.StateEnforce), EgressGen: 2,
		Ingress: uint8(policy.StateEnforce), IngressGen: 1}))
	c2, err := nettest.Dial(a.NS, net.JoinHostPort(b.IP(4).String(), "80"))
	require.NoError(t, err)
	defer c2.Close()
	require.NoError(t, nettest.Echo(c2, "before eviction\n"))
	evicted := 0
	var fk maps.CniPolicyFlowKey
	var fv maps.CniPolicyFlow
	var replies []maps.CniPolicyFlowKey
	it := pm.FlowMap.Iterate()
	for it.Next(&fk, &fv) {
		if fv.Reply == 1 && net.IP(fk.Saddr[:4]).Equal(b.IP(4)) {
			replies = append(replies, fk)
		}
	}
	require.NoError(t, it.Err())
	for _, k := range replies {
		require.NoError(t, pm.FlowMap.Delete(&k))
		evicted++
	}
	require.NotZero(t, evicted, "no reply entry of b's to evict")
	_ = c2.SetDeadline(time.Now().Add(5 * time.Second))
	require.NoError(t, nettest.Echo(c2, "after eviction\n"), "b's replies dropped once their decision was evicted")
	require.NoError(t, pm.SetEndpoint(ia, policy.EndpointState{}))
	_, ok, err := pm.Endpoint(ia)
	require.NoError(t, err)
	require.False(t, ok, "an endpoint open both ways keeps a state entry")
	require.True(t, reaches(a.NS, b.IP(4), 80), "a -> b:80 with a's egress open again")

	// ADD in a namespace with ingress policies: closed from the start;
	// in another namespace: open, no entry.
	require.NoError(t, pm.SetNamespace("locked", policy.NamespaceFact{Ingress: true}))
	for _, ver := range testutil.SpecVersions {
		vlist := e.confList(netOpts{version: ver})
		c := e.addK8sPod(vlist, "pol-c-"+ver, "locked", "c")
		ic := uint32(e.hostIndex(c))
		st, ok, err := pm.Endpoint(ic)
		require.NoError(t, err)
		require.True(t, ok, "%s: no state for a pod of a policied namespace", ver)
		require.Equal(t, uint8(policy.StateClosed), st.Ingress, ver)
		require.Equal(t, uint8(policy.StateOpen), st.Egress, ver)
		l, err := nettest.ListenPort(c.NS, c.IP(4), 80)
		require.NoError(t, err)
		require.True(t, blocked(a.NS, c.IP(4), 80), "%s: a -> new pod of a policied namespace", ver)
		l.Close()
		d := e.addK8sPod(vlist, "pol-d-"+ver, "open", "d")
		_, ok, err = pm.Endpoint(uint32(e.hostIndex(d)))
		require.NoError(t, err)
		require.False(t, ok, "%s: a pod of a namespace without policies has a state", ver)
		require.NoError(t, e.cni.DelPod(vlist, c), ver)
		_, ok, err = pm.Endpoint(ic)
		require.NoError(t, err)
		require.False(t, ok, "%s: state left after DEL", ver)
		require.NoError(t, e.cni.DelPod(vlist, d), ver)
	}
	require.NoError(t, e.cni.DelPod(list, a))
	require.NoError(t, e.cni.DelPod(list, b))
	e.requireClean()
}

// Flows a pod opened while neither end was isolated are remembered
// nowhere; when the pod becomes isolated (its ingress closed: it admits
// nobody), their replies still pass: a packet that cannot open a flow (a
// TCP packet other than a SYN: the SYN-ACK of a handshake, an established
// connection's data) is decided as opened the other way when it is denied
// as opened its own way. A SYN is never a reply: a peer the pod denies
// cannot reuse the tuple of a flow the pod opened to it.
func TestPolicyFlowsBeforeIsolation(t *testing.T) {
	e, list, pm, a, b := policyPair(t)
	ia := uint32(e.hostIndex(a))
	// Connections a opens to b; b's side of each pushes what follows,
	// which a never answers but by ACKs.
	type conn struct{ c, s net.Conn }
	conns := map[int]conn{}
	push := func(fam int, msg string) error {
		x := conns[fam]
		if _, err := x.s.Write([]byte(msg)); err != nil {
			return err
		}
		_ = x.c.SetDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, len(msg))
		if _, err := io.ReadFull(x.c, buf); err != nil {
			return err
		}
		if string(buf) != msg {
			return fmt.Errorf("read %q, not %q", buf, msg)
		}
		return nil
	}
	for _, fam := range []int{4, 6} {
		var l net.Listener
		require.NoError(t, b.NS.Do(func(ns.NetNS) error {
			var err error
			l, err = net.Listen("tcp", net.JoinHostPort(b.IP(fam).String(), "80"))
			return err
		}))
		t.Cleanup(func() { l.Close() })
		accepted := make(chan net.Conn, 1)
		go func() {
			if s, err := l.Accept(); err == nil {
				accepted <- s
			}
		}()
		c, err := nettest.Dial(a.NS, net.JoinHostPort(b.IP(fam).String(), "80"))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		s := <-accepted
		t.Cleanup(func() { s.Close() })
		conns[fam] = conn{c, s}
		require.NoError(t, push(fam, "open\n"), "IPv%d b -> a on a's connection, without policy", fam)
	}
	on, err := pm.Active()
	require.NoError(t, err)
	require.False(t, on, "policy lookups on without any policy: the flows would be remembered")

	require.NoError(t, pm.SetEndpoint(ia, policy.EndpointState{Ingress: uint8(policy.StateClosed)}))
	for _, fam := range []int{4, 6} {
		require.NoError(t, push(fam, "isolated\n"),
			"IPv%d: b's data on a connection a opened before its ingress closed was dropped", fam)
	}
	drops, err := pm.Drops(ia, policy.Ingress)
	require.NoError(t, err)
	require.Zero(t, drops, "packets that passed counted as a's ingress drops")

	// a opens a flow from port 5001 to b:8080 (refused: b does not
	// listen), then listens on 5001: b's SYN from 8080 to it is no reply.
	for _, fam := range []int{4, 6} {
		_, err := dialFrom(a.NS, 5001, b.IP(fam), 8080)
		require.Error(t, err, "IPv%d a -> b:8080, where b does not listen", fam)
		l, err := nettest.ListenPort(a.NS, a.IP(fam), 5001)
		require.NoError(t, err)
		c, err := dialFrom(b.NS, 8080, a.IP(fam), 5001)
		if err == nil {
			c.Close()
		}
		l.Close()
		require.Error(t, err, "IPv%d: b reached a's closed ingress by a SYN on the tuple of a's flow to it", fam)
	}
	drops, err = pm.Drops(ia, policy.Ingress)
	require.NoError(t, err)
	require.NotZero(t, drops, "b's SYNs to a not counted as a's ingress drops")

	for _, x := range conns {
		x.c.Close()
		x.s.Close()
	}
	require.NoError(t, pm.SetEndpoint(ia, policy.EndpointState{}))
	require.NoError(t, e.cni.DelPod(list, a))
	require.NoError(t, e.cni.DelPod(list, b))
	e.requireClean()
}

// A pod reaching another pod of its node through a hostPort of the node
// (the translation is from_container's own): the target's ingress policy
// decides the flow as the target sees it, translated (its address and
// containerPort).
func TestPolicyHostPortHairpin(t *testing.T) {
	e := newEnv(t)
	list := e.hostPortList("", "", testutil.Cgroup(t), nil)
	pm := e.policyMaps()
	a := e.addK8sPod(list, "polhp-a", "web", "a")
	b := e.addK8sPod(list, "polhp-b", "web", "b", mapping(8080, 80, "tcp"))
	ib := uint32(e.hostIndex(b))
	l, err := nettest.ListenPort(b.NS, b.IP(4), 80)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	require.True(t, reaches(a.NS, nettest.NodeIP4, 8080), "a -> the node's hostPort without policy")

	require.NoError(t, pm.SetEndpoint(ib, policy.EndpointState{Ingress: uint8(policy.StateClosed)}))
	require.True(t, blocked(a.NS, nettest.NodeIP4, 8080), "a -> the node's hostPort, b's ingress closed")
	require.NoError(t, pm.PutRules(ib, policy.Ingress, []policy.Entry{{Prefix: hostPrefix(a.IP(4)), Rule: tcpRule(80, 80)}}))
	require.NoError(t, pm.SetEndpoint(ib, policy.EndpointState{Ingress: uint8(policy.StateEnforce), IngressGen: 1}))
	require.True(t, reaches(a.NS, nettest.NodeIP4, 8080), "a -> the node's hostPort, b admits a on its containerPort 80")
	require.NoError(t, pm.PutRules(ib, policy.Ingress, []policy.Entry{{Prefix: hostPrefix(a.IP(4)), Rule: tcpRule(8080, 8080)}}))
	require.NoError(t, pm.SetEndpoint(ib, policy.EndpointState{Ingress: uint8(policy.StateEnforce), IngressGen: 2}))
	require.True(t, blocked(a.NS, nettest.NodeIP4, 8080), "a -> the node's hostPort, b admits the hostPort's number only (not what it sees)")
}
