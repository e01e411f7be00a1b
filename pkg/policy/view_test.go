package policy_test

import (
	"bytes"
	"encoding/json"
	"net"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/internal/nodetest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/cli"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// The policy command and the endpoints command's policy columns, run as
// the operator runs them (pkg/cli: the node's endpoints from records and
// maps, the features' commands and columns from the registry).

// Host ifindexes of the policy tests' endpoints: no device of this netns
// has them (nothing is attached; the CLI finds no veth).
const (
	ifWeb    = 1<<20 + 1
	ifDB     = 1<<20 + 2
	ifPlain  = 1<<20 + 3
	ifOrphan = 1<<20 + 9
)

// policyNode is a node's maps in a private bpffs, written as ADD and the
// agent write them: namespace facts, three pods (shop/web-0 enforced both
// ways with rules, shop/db-0 closed as ADD starts it, other/app open), an
// orphan state, drops.
type policyNode struct {
	bpfRoot, stateDir string
	pm                *policy.Maps
}

func newPolicyNode(t *testing.T) *policyNode {
	t.Helper()
	n := &policyNode{bpfRoot: testutil.BPFFS(t), stateDir: t.TempDir()}
	pm, err := policy.Open(nodetest.Handle(t, n.bpfRoot, n.stateDir))
	require.NoError(t, err)
	t.Cleanup(pm.Close)
	n.pm = pm
	ms, err := maps.OpenPinned(n.bpfRoot, maps.CniMapEndpoints, maps.CniMapEndpointDevs, maps.CniMapEndpointPods)
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, m := range ms {
			m.Close()
		}
	})
	em := &endpoint.Maps{Endpoints: ms[maps.CniMapEndpoints], Devs: ms[maps.CniMapEndpointDevs], Pods: ms[maps.CniMapEndpointPods]}

	require.NoError(t, pm.SetNamespace("shop", policy.NamespaceFact{Ingress: true, Egress: true}))
	require.NoError(t, pm.SetNamespace("team", policy.NamespaceFact{Ingress: true}))
	mac := func(b byte) net.HardwareAddr { return net.HardwareAddr{0x0e, 0, 0, 0, 0, b} }
	for _, e := range []*endpoint.Entry{
		{HostIfIndex: ifWeb, ContainerID: "web", IfName: "eth0", MAC: mac(1), HostMAC: mac(2),
			IPs: []net.IP{net.ParseIP("10.244.1.5"), net.ParseIP("fd00:10:244:1::5")}, Pod: &endpoint.Pod{Namespace: "shop", Name: "web-0"}},
		{HostIfIndex: ifDB, ContainerID: "db", IfName: "eth0", MAC: mac(3), HostMAC: mac(4),
			IPs: []net.IP{net.ParseIP("10.244.1.6")}, Pod: &endpoint.Pod{Namespace: "shop", Name: "db-0"}},
		{HostIfIndex: ifPlain, ContainerID: "plain", IfName: "eth0", MAC: mac(5), HostMAC: mac(6),
			IPs: []net.IP{net.ParseIP("10.244.1.7")}, Pod: &endpoint.Pod{Namespace: "other", Name: "app"}},
	} {
		// The first state as the feature's ADD writes it, then the entries.
		st, err := pm.StartState(e.Pod.Namespace)
		require.NoError(t, err)
		require.NoError(t, pm.SetEndpoint(uint32(e.HostIfIndex), st))
		require.NoError(t, em.Put(e))
	}
	// web has a record: the CLI knows its host veth by it.
	require.NoError(t, node.WriteRecord(n.stateDir, &node.Record{ContainerID: "web", IfName: "eth0", HostIfName: "ecpolweb0", HostIfIndex: ifWeb,
		MAC: mac(1).String(), HostMAC: mac(2).String(), IPs: []string{"10.244.1.5/32"}}))

	writeWebRules(t, pm)
	require.NoError(t, pm.SetEndpoint(ifWeb, policy.EndpointState{Ingress: uint8(policy.StateEnforce), Egress: uint8(policy.StateEnforce),
		IngressGen: 3, EgressGen: 1}))
	require.NoError(t, pm.SetEndpoint(ifOrphan, policy.EndpointState{Ingress: uint8(policy.StateClosed)}))

	// Drops as the programs count them: per CPU.
	cpus, err := ebpf.PossibleCPU()
	require.NoError(t, err)
	drops := func(ifindex uint32, d policy.Direction, n uint64) {
		per := make([]uint64, cpus)
		per[0] = n - n/2
		per[cpus-1] += n / 2
		k := maps.CniPolicyDropKey{Ifindex: ifindex, Dir: uint32(d)}
		require.NoError(t, pm.DropMap.Put(&k, per))
	}
	drops(ifWeb, policy.Ingress, 12)
	drops(ifDB, policy.Egress, 1500)
	return n
}

// writeWebRules writes the agent's rules for web: ingress from the pod
// range on tcp/80 (one policy), from one pod on more ports (two), a range
// carved out (except), IPv6 from six policies; egress DNS anywhere.
func writeWebRules(t *testing.T, pm *policy.Maps) {
	t.Helper()
	allowWeb, err := pm.SetName("shop", "allow-web")
	require.NoError(t, err)
	allowDNS, err := pm.SetName("shop", "allow-dns")
	require.NoError(t, err)
	ports := func(r *policy.Rule, ps ...maps.CniPolicyPort) {
		r.N_ports = uint8(copy(r.Ports[:], ps))
	}
	sources := func(r *policy.Rule, n int, ids ...uint32) {
		copy(r.Sources[:], ids)
		r.N_sources = uint8(n)
	}
	var fromRange, fromPod, except, v6, dns, full policy.Rule
	ports(&fromRange, maps.CniPolicyPort{Proto: unix.IPPROTO_TCP, First: 80, Last: 80})
	sources(&fromRange, 1, allowWeb)
	ports(&fromPod, maps.CniPolicyPort{Proto: unix.IPPROTO_TCP, First: 80, Last: 80}, maps.CniPolicyPort{Proto: unix.IPPROTO_UDP, First: 53, Last: 55})
	sources(&fromPod, 2, allowWeb, allowDNS)
	v6.Flags = uint8(maps.CniPolicyRuleFlagsPOLICY_F_ALL_PORTS)
	sources(&v6, 6, allowWeb, allowDNS, 0xdead, allowWeb)
	full.Flags = v6.Flags
	sources(&full, 4, allowWeb, allowDNS, allowWeb, allowDNS)
	ports(&dns, maps.CniPolicyPort{Proto: unix.IPPROTO_UDP, First: 53, Last: 53}, maps.CniPolicyPort{Proto: unix.IPPROTO_SCTP, First: 9, Last: 9})
	sources(&dns, 1, allowDNS)
	require.NoError(t, pm.PutRules(ifWeb, policy.Ingress, []policy.Entry{
		{Prefix: netip.MustParsePrefix("fd00:10:244::/48"), Rule: v6},
		{Prefix: netip.MustParsePrefix("10.244.2.0/24"), Rule: except},
		{Prefix: netip.MustParsePrefix("10.244.1.8/32"), Rule: fromPod},
		{Prefix: netip.MustParsePrefix("10.244.0.0/16"), Rule: fromRange},
		{Prefix: netip.MustParsePrefix("fd00:10:244:2::9/128"), Rule: full},
	}))
	require.NoError(t, pm.PutRules(ifWeb, policy.Egress, []policy.Entry{{Prefix: netip.MustParsePrefix("0.0.0.0/0"), Rule: dns}}))
}

// run runs the operator CLI on the node.
func (n *policyNode) run(args ...string) (stdout, stderr string, code int) {
	var o, e bytes.Buffer
	code = cli.Main(append(args, "--bpf-root", n.bpfRoot, "--state-dir", n.stateDir), &o, &e)
	return o.String(), e.String(), code
}

// TestPolicyCommand: the node line, then per endpoint and direction its
// state, generation, drops and, when enforced, each peer prefix with its
// ports and the policies that allow it; JSON holds the same.
func TestPolicyCommand(t *testing.T) {
	n := newPolicyNode(t)
	out, errOut, code := n.run("policy")
	require.Equal(t, cli.ExitOK, code, errOut)
	t.Log("\n" + out)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	require.Equal(t, "policy lookups: on; endpoints isolated: 3 of 4 (ingress 3, egress 2); namespaces with policies: 2: shop (ingress, egress), team (ingress)", lines[0])
	require.Equal(t, "", lines[1])
	require.Regexp(t, `^POD +HOST VETH +IPS +DIRECTION +STATE +GEN +DROPS +PEER +PORTS +POLICIES$`, lines[2])
	want := []string{
		// db-0 as ADD started it: closed both ways, waiting for the agent.
		`^shop/db-0 +- +10\.244\.1\.6 +ingress +closed +- +0 +none +- +\(waiting for the agent to write its rules\)$`,
		`^ +egress +closed +- +1\.5k +none +- +\(waiting for the agent to write its rules\)$`,
		`^other/app +- +10\.244\.1\.7 +ingress +open +- +0 +all peers +all ports +\(no policy selects it\)$`,
		`^ +egress +open +- +0 +all peers +all ports +\(no policy selects it\)$`,
		// web-0: longest prefixes under their wider ones, IPv4 first.
		`^shop/web-0 +ecpolweb0 +10\.244\.1\.5,fd00:10:244:1::5 +ingress +enforced +3 +12 +10\.244\.0\.0/16 +tcp/80 +shop/allow-web$`,
		`^ +10\.244\.1\.8/32 +tcp/80, udp/53-55 +shop/allow-web, shop/allow-dns$`,
		`^ +10\.244\.2\.0/24 +none +-$`,
		`^ +fd00:10:244::/48 +all ports +shop/allow-web, shop/allow-dns, policy 0xdead, shop/allow-web \+2 more$`,
		`^ +fd00:10:244:2::9/128 +all ports +shop/allow-web, shop/allow-dns, shop/allow-web, shop/allow-dns \+maybe more$`,
		`^ +egress +enforced +1 +0 +0\.0\.0\.0/0 +udp/53, sctp/9 +shop/allow-dns$`,
		`^- +\(ifindex 1048585\) +- +ingress +closed +- +0 +none +- +\(waiting`,
		`^ +egress +open +- +0 +all peers`,
	}
	require.Len(t, lines, 3+len(want), out)
	for i, re := range want {
		require.Regexp(t, re, lines[3+i])
	}
	col := strings.Index(lines[2], "PEER")
	require.Equal(t, col, strings.Index(lines[8], "10.244.1.8/32"), "peer column misaligned:\n%s", out)

	out, errOut, code = n.run("policy", "-o", "json")
	require.Equal(t, cli.ExitOK, code, errOut)
	var got policy.PolicyOutput
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.True(t, got.Node.Lookups)
	require.Equal(t, 4, got.Node.Endpoints)
	require.Equal(t, []policy.PolicyNamespace{{"shop", true, true}, {"team", true, false}}, got.Node.Namespaces)
	require.Len(t, got.Endpoints, 4)
	web := got.Endpoints[2]
	require.Equal(t, "web", web.ContainerID)
	require.Equal(t, &node.Pod{Namespace: "shop", Name: "web-0"}, web.Pod)
	require.Equal(t, policy.PolicyDirection{State: "enforced", Generation: 3, Drops: 12}, web.Ingress.PolicyDirection)
	require.Equal(t, policy.PolicyRule{Peer: "10.244.1.8/32", Ports: []policy.PolicyPort{{Protocol: "tcp", First: 80, Last: 80}, {Protocol: "udp", First: 53, Last: 55}},
		Policies: []string{"shop/allow-web", "shop/allow-dns"}}, web.Ingress.Rules[1])
	require.Equal(t, policy.PolicyRule{Peer: "10.244.2.0/24", Ports: []policy.PolicyPort{}, Policies: []string{}}, web.Ingress.Rules[2])
	require.True(t, web.Ingress.Rules[3].AllPorts)
	require.Equal(t, 2, web.Ingress.Rules[3].MorePolicies)
	require.False(t, web.Ingress.Rules[3].MaybeMore)
	require.True(t, web.Ingress.Rules[4].MaybeMore)
	require.Zero(t, web.Ingress.Rules[4].MorePolicies)
	require.Equal(t, policy.PolicyDirection{State: "closed", Drops: 1500}, got.Endpoints[0].Egress.PolicyDirection)
	require.Equal(t, []policy.PolicyRule{}, got.Endpoints[0].Egress.Rules)
	// Field names scripts rely on.
	require.Regexp(t, regexp.MustCompile(`"rules": \[\s+\{\s+"peer": "0\.0\.0\.0/0",\s+"allPorts": false,\s+"ports": \[\s+\{\s+"protocol": "udp",\s+"first": 53,\s+"last": 53`), out)
	for _, k := range []string{`"lookups"`, `"isolated"`, `"any"`, `"namespaces"`, `"hostVeth"`, `"hostIfindex"`, `"ips"`, `"state"`, `"generation"`, `"drops"`, `"policies"`, `"morePolicies"`, `"maybeMore"`} {
		require.Contains(t, out, k)
	}
}

// TestPolicyFilter: --pod and --veth select one endpoint; the node line
// still counts the node's; a filter matching nothing is an error.
func TestPolicyFilter(t *testing.T) {
	n := newPolicyNode(t)
	for _, args := range [][]string{{"--pod", "shop/web-0"}, {"--veth", "ecpolweb0"}, {"--pod", "web/eth0"}} {
		out, errOut, code := n.run(append([]string{"policy", "-o", "json"}, args...)...)
		require.Equal(t, cli.ExitOK, code, errOut)
		var got policy.PolicyOutput
		require.NoError(t, json.Unmarshal([]byte(out), &got))
		require.Len(t, got.Endpoints, 1, args)
		require.Equal(t, ifWeb, got.Endpoints[0].HostIfIndex, args)
		require.Equal(t, 4, got.Node.Endpoints)
		require.Equal(t, 3, got.Node.Isolated.Any)
	}
	out, _, code := n.run("policy", "--pod", "other/app")
	require.Equal(t, cli.ExitOK, code)
	require.Len(t, strings.Split(strings.TrimRight(out, "\n"), "\n"), 5, out)
	for _, o := range []string{"table", "json"} {
		out, errOut, code := n.run("policy", "--pod", "shop/nope", "-o", o)
		require.Equal(t, cli.ExitError, code, o)
		require.Empty(t, out, o)
		require.Contains(t, errOut, "no endpoint on this node matches --pod or --veth", o)
	}
}

// TestPolicyNotPinned: a node whose policy maps are not pinned (no pod
// added since the upgrade to a build with NetworkPolicy) shows everything
// open, lookups off.
func TestPolicyNotPinned(t *testing.T) {
	n := &policyNode{bpfRoot: testutil.BPFFS(t), stateDir: t.TempDir()}
	ms, err := maps.OpenPinned(n.bpfRoot, maps.CniMapEndpointDevs)
	require.NoError(t, err)
	d := maps.CniEndpointDev{}
	maps.CString(d.ContainerId[:], "old")
	require.NoError(t, ms[maps.CniMapEndpointDevs].Put(uint32(ifWeb), &d))
	ms[maps.CniMapEndpointDevs].Close()
	out, errOut, code := n.run("policy")
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Contains(t, out, "policy lookups: off; endpoints isolated: 0 of 1 (ingress 0, egress 0); namespaces with policies: none\n")
	require.Regexp(t, `(?m)^old/- +- +- +ingress +open +- +0 +all peers`, out)
}

// TestEndpointsPolicy: the endpoints view shows each endpoint's policy
// state and drops per direction (table and JSON), all open on a node
// without policy maps.
func TestEndpointsPolicy(t *testing.T) {
	n := newPolicyNode(t)
	out, errOut, code := n.run("endpoints")
	require.Equal(t, cli.ExitOK, code, errOut)
	t.Log("\n" + out)
	lines := strings.Split(out, "\n")
	require.Regexp(t, `  POLICY +POLICY DROPS +STATE$`, lines[0])
	for _, want := range []string{
		`^db/eth0 +shop/db-0 .*  in:closed eg:closed +in:0 eg:1\.5k +problem$`,
		`^plain/eth0 +other/app .*  in:open eg:open +in:0 eg:0 +problem$`,
		`^web/eth0 +shop/web-0 +ecpolweb0 .*  in:enforced eg:enforced +in:12 eg:0 +problem$`,
	} {
		require.Regexp(t, `(?m)`+want, out)
	}
	col := strings.Index(lines[0], "POLICY DROPS")
	require.Equal(t, col, strings.Index(lines[1], "in:0 eg:1.5k"), "policy drops column misaligned:\n%s", out)

	out, errOut, code = n.run("endpoints", "-o", "json")
	require.Equal(t, cli.ExitOK, code, errOut)
	var eps []struct {
		ContainerID string                 `json:"containerID"`
		Policy      *policy.EndpointPolicy `json:"policy"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &eps))
	got := map[string]*policy.EndpointPolicy{}
	for _, e := range eps {
		got[e.ContainerID] = e.Policy
	}
	require.Equal(t, map[string]*policy.EndpointPolicy{
		"db":    {Ingress: policy.PolicyDirection{State: "closed"}, Egress: policy.PolicyDirection{State: "closed", Drops: 1500}},
		"plain": {Ingress: policy.PolicyDirection{State: "open"}, Egress: policy.PolicyDirection{State: "open"}},
		"web":   {Ingress: policy.PolicyDirection{State: "enforced", Generation: 3, Drops: 12}, Egress: policy.PolicyDirection{State: "enforced", Generation: 1}},
	}, got)

	bare := &policyNode{bpfRoot: testutil.BPFFS(t), stateDir: t.TempDir()}
	ms, err := maps.OpenPinned(bare.bpfRoot, maps.CniMapEndpointDevs)
	require.NoError(t, err)
	var d maps.CniEndpointDev
	maps.CString(d.ContainerId[:], "old")
	require.NoError(t, ms[maps.CniMapEndpointDevs].Put(uint32(ifWeb), &d))
	ms[maps.CniMapEndpointDevs].Close()
	out, errOut, code = bare.run("endpoints")
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Regexp(t, `(?m)^old/- .*  in:open eg:open +in:0 eg:0 +problem$`, out)
}

// TestPolicyCommandClusterNetworkPolicy: where ClusterNetworkPolicies
// decide, each range shows its verdict and what won it (tier, policy,
// priority, action), and what no range lists its own.
func TestPolicyCommandClusterNetworkPolicy(t *testing.T) {
	n := newPolicyNode(t)
	pm, err := policy.Open(nodetest.Handle(t, n.bpfRoot, n.stateDir))
	require.NoError(t, err)
	t.Cleanup(pm.Close)
	denyMeta, err := pm.SetSource(policy.Source{Tier: policy.TierAdmin, Priority: 10, Name: "deny-metadata"})
	require.NoError(t, err)
	dnsOK, err := pm.SetSource(policy.Source{Tier: policy.TierBaseline, Priority: 3, Name: "dns"})
	require.NoError(t, err)
	allowDNS := policy.ID("shop", "allow-dns")
	var meta, dns policy.Rule
	meta.Flags = uint8(maps.CniPolicyRuleFlagsPOLICY_F_EXCEPT_PORTS)
	meta.Sources[0], meta.N_sources, meta.Rest = denyMeta, 1, 0
	meta.Ports[0] = maps.CniPolicyPort{Proto: unix.IPPROTO_TCP, First: 80, Last: 80, Src: 1 | uint8(maps.CniPolicyPortSrcPOLICY_PORT_DENIED)}
	meta.N_ports = 1
	dns.Sources[0], dns.Sources[1], dns.N_sources, dns.Rest = dnsOK, allowDNS, 2, 2
	dns.Ports[0] = maps.CniPolicyPort{Proto: unix.IPPROTO_UDP, First: 53, Last: 53, Src: 1}
	dns.N_ports = 1
	require.NoError(t, pm.PutRules(ifWeb, policy.Egress, []policy.Entry{
		{Prefix: netip.MustParsePrefix("0.0.0.0/0"), Rule: dns},
		{Prefix: netip.MustParsePrefix("169.254.169.254/32"), Rule: meta},
	}))
	out, errOut, code := n.run("policy", "--pod", "shop/web-0")
	require.Equal(t, cli.ExitOK, code, errOut)
	t.Log("\n" + out)
	require.Regexp(t, `(?m)^ +egress +enforced +1 +0 +0\.0\.0\.0/0 +udp/53 allow, others deny +udp/53: Accept by Baseline dns \(priority 3\); others: deny by shop/allow-dns$`, out)
	require.Regexp(t, `(?m)^ +169\.254\.169\.254/32 +tcp/80 deny, others allow +tcp/80: Deny by Admin deny-metadata \(priority 10\); others: default$`, out)

	out, errOut, code = n.run("policy", "--pod", "shop/web-0", "-o", "json")
	require.Equal(t, cli.ExitOK, code, errOut)
	var got policy.PolicyOutput
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	eg := got.Endpoints[0].Egress.Rules
	require.Len(t, eg, 2)
	prio := 10
	require.Equal(t, []policy.PolicyPort{{Protocol: "tcp", First: 80, Last: 80, Denied: true,
		Decision: &policy.PolicyDecision{Tier: "Admin", Policy: "deny-metadata", Priority: &prio, Action: "Deny"}}}, eg[1].Ports)
	require.True(t, eg[1].Tiered)
	require.Equal(t, "allow", eg[1].Others)
	require.Equal(t, &policy.PolicyDecision{Action: "default"}, eg[1].OthersDecision)
	require.Equal(t, &policy.PolicyDecision{Tier: "NetworkPolicy", Policy: "shop/allow-dns", Action: "deny"}, eg[0].OthersDecision)
}
