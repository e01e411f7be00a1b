package policy

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	xmaps "maps" // the standard library's: "maps" is pkg/maps here
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

// command is the operator CLI's policy command.
var command = &view.Command{
	Name:    "policy",
	Summary: "NetworkPolicy per endpoint: isolated or not, which peers and ports are allowed by which policy, packets denied",
	Help: `What the NetworkPolicy maps the node agent writes let each pod receive
(ingress) and send (egress), as the programs enforce it (docs/networkpolicy.md).

The first line is the node's: policy lookups on or off (off until some pod
is isolated: the programs then skip every policy lookup), how many
endpoints are isolated in each direction, and the namespaces that have
policies (new pods of those start with the policies' directions closed).

Then one block per endpoint (pod namespace/name from endpoint_pods, host
veth, addresses) and direction, with its STATE:
  open      no policy selects the pod for this direction: everything passes
  closed    isolated, waiting for the agent to write its rules: nothing passes
  enforced  only what the rows below it allow passes
GEN is the generation of the direction's rules (a flow decided under an
older one is decided again); DROPS the packets denied in that direction
(drop_policy_ingress and drop_policy_egress in 'ebpf-cni counters').
For an enforced direction, one row per peer prefix: PORTS the peers may
use ("tcp/80, udp/53-55", "all ports" for every protocol and port, "none"
for an except carved out of a wider prefix) and POLICIES, the policies
that allow it (4 are recorded per prefix: "+N more" says how many others
do too when the agent counted them, "+maybe more" that all 4 slots are
used). Where ClusterNetworkPolicies select the pod, PORTS gives each
range its verdict ("tcp/80 deny, others allow": others are the ports no
range lists, ICMP among them) and POLICIES what won each ("tcp/80: Deny
by Admin deny-metadata (priority 10); others: default"): Accept or Deny
of a ClusterNetworkPolicy of tier Admin or Baseline, allow or deny of the
NetworkPolicies that isolate the pod, default (no policy decided:
allowed). A peer matches its longest prefix only. --pod or --veth that
matches no endpoint of the node is an error.

JSON: {"node": {"lookups", "endpoints", "isolated": {"any", "ingress", "egress"},
"namespaces": [{"namespace", "ingress", "egress"}]}, "endpoints":
[{"containerID", "ifname", "pod" (namespace, name, uid; absent without
K8S_POD_*), "hostVeth", "hostIfindex", "ips", "ingress" and "egress":
{"state" (open|closed|enforced), "generation", "drops", "rules":
[{"peer", "allPorts", "ports": [{"protocol", "first", "last", "denied",
"decision": {"tier", "policy", "priority", "action"}}], "policies",
"morePolicies", "maybeMore", "tiered", "others" (allow|deny),
"othersDecision"}]}}]}. "rules" lists what the maps hold
whatever the state (only an enforced direction uses them).`,
	Flags: func(fs *flag.FlagSet) func(*view.Context) error {
		var o policyOpts
		fs.StringVar(&o.pod, "pod", "", "only pod `NAMESPACE/NAME` (or containerID/ifname)")
		fs.StringVar(&o.veth, "veth", "", "only the endpoint of host veth `NAME`")
		return func(ctx *view.Context) error { return runPolicy(ctx, o) }
	},
}

// columns are POLICY and POLICY DROPS of the endpoints command, and each
// endpoint's "policy" in its JSON.
var columns = &view.Columns{
	Header: []string{"POLICY", "POLICY DROPS"},
	Help: `POLICY: the NetworkPolicy state of ingress and egress (open: no policy
selects the pod; closed: isolated, waiting for the node agent to write its
rules; enforced: only what its policies allow, see ebpf-cni policy),
POLICY DROPS: the packets denied each way,`,
	Key:      "policy",
	JSONHelp: "policy (ingress, egress: state open|closed|enforced, generation, drops)",
	Read:     readColumns,
}

// readColumns are the state and the drops of both directions of eps.
func readColumns(ctx *view.Context, eps []view.EndpointRef) ([]view.Cells, error) {
	v, closeMaps, err := readPolicy(ctx)
	if err != nil {
		return nil, err
	}
	defer closeMaps()
	out := make([]view.Cells, len(eps))
	for i, e := range eps {
		p, err := v.endpointPolicy(uint32(e.HostIfIndex))
		if err != nil {
			return nil, err
		}
		out[i] = view.Cells{JSON: p, Text: []string{"in:" + p.Ingress.State + " eg:" + p.Egress.State,
			"in:" + view.HumanCount(p.Ingress.Drops) + " eg:" + view.HumanCount(p.Egress.Drops)}}
	}
	return out, nil
}

type policyOpts struct{ pod, veth string }

// wants: e passes the filters.
func (o policyOpts) wants(e *view.EndpointRef) bool {
	if o.veth != "" && e.HostVeth != o.veth {
		return false
	}
	return e.Matches(o.pod)
}

// PolicyDirection is the state of one direction of an endpoint (the
// endpoints command shows it too).
type PolicyDirection struct {
	State      string `json:"state"`      // open, closed, enforced
	Generation uint32 `json:"generation"` // of the direction's rules; 0: never written
	Drops      uint64 `json:"drops"`      // packets denied in this direction
}

// EndpointPolicy is an endpoint's two directions.
type EndpointPolicy struct {
	Ingress PolicyDirection `json:"ingress"`
	Egress  PolicyDirection `json:"egress"`
}

// PolicyPort is a port range a rule allows.
type PolicyPort struct {
	Protocol string `json:"protocol"` // tcp, udp, sctp (or the protocol's number)
	First    uint16 `json:"first"`
	Last     uint16 `json:"last"`
	// Denied: the range is denied (where ClusterNetworkPolicies decide);
	// Decision: what decided it, when recorded.
	Denied   bool            `json:"denied,omitempty"`
	Decision *PolicyDecision `json:"decision,omitempty"`
}

// PolicyDecision is the policy that won a decision: its tier (Admin,
// NetworkPolicy, Baseline; "" for no policy: allowed by default), its
// name (namespace/name of a NetworkPolicy), a ClusterNetworkPolicy's
// priority, and the action: Accept or Deny (a ClusterNetworkPolicy's
// rule), allow or deny (what NetworkPolicies allow, or not, where they
// isolate the pod), default (no policy decided: allowed).
type PolicyDecision struct {
	Tier     string `json:"tier,omitempty"`
	Policy   string `json:"policy,omitempty"`
	Priority *int   `json:"priority,omitempty"`
	Action   string `json:"action"`
}

func (d *PolicyDecision) String() string {
	switch {
	case d.Policy == "":
		return d.Action
	case d.Priority != nil:
		return fmt.Sprintf("%s by %s %s (priority %d)", d.Action, d.Tier, d.Policy, *d.Priority)
	}
	return fmt.Sprintf("%s by %s", d.Action, d.Policy)
}

// PolicyRule is what the peers of one prefix may use, and why.
type PolicyRule struct {
	Peer     string       `json:"peer"`
	AllPorts bool         `json:"allPorts"` // every protocol and port, ICMP too
	Ports    []PolicyPort `json:"ports"`
	// Policies are the recorded policies that allow it (namespace/name),
	// MorePolicies how many others do too, when the agent counted them;
	// MaybeMore: every slot is used (4), and the agent did not count the
	// others, if any.
	Policies     []string `json:"policies"`
	MorePolicies int      `json:"morePolicies"`
	MaybeMore    bool     `json:"maybeMore"`
	// Where ClusterNetworkPolicies decide (Tiered): Others is what the
	// ports not listed get, protocols without ports (ICMP) among them:
	// allow or deny; OthersDecision what decided it.
	Tiered         bool            `json:"tiered,omitempty"`
	Others         string          `json:"others,omitempty"`
	OthersDecision *PolicyDecision `json:"othersDecision,omitempty"`
}

// PolicyRules is one direction of an endpoint with its rules.
type PolicyRules struct {
	PolicyDirection
	Rules []PolicyRule `json:"rules"`
}

// PolicyEndpoint is one endpoint in the policy command's output.
type PolicyEndpoint struct {
	ContainerID string      `json:"containerID"`
	IfName      string      `json:"ifname"`
	Pod         *node.Pod   `json:"pod,omitempty"`
	HostVeth    string      `json:"hostVeth"`
	HostIfIndex int         `json:"hostIfindex"`
	IPs         []string    `json:"ips"`
	Ingress     PolicyRules `json:"ingress"`
	Egress      PolicyRules `json:"egress"`
}

// PolicyNamespace is a namespace that has policies, and the directions
// they isolate.
type PolicyNamespace struct {
	Namespace string `json:"namespace"`
	Ingress   bool   `json:"ingress"`
	Egress    bool   `json:"egress"`
}

// PolicyNode is the node's summary.
type PolicyNode struct {
	Lookups bool `json:"lookups"` // policy_config: the programs look policies up
	// Endpoints of the node, and how many are isolated (a direction not
	// open): all of the node's, whatever --pod and --veth select.
	Endpoints int `json:"endpoints"`
	Isolated  struct {
		Any     int `json:"any"`
		Ingress int `json:"ingress"`
		Egress  int `json:"egress"`
	} `json:"isolated"`
	Namespaces []PolicyNamespace `json:"namespaces"`
}

// PolicyOutput is what the policy command shows.
type PolicyOutput struct {
	Node      PolicyNode        `json:"node"`
	Endpoints []*PolicyEndpoint `json:"endpoints"`
}

// policyView is what the policy maps hold, read once. Maps that are not
// pinned (no pod added since an upgrade to a build with NetworkPolicy, or
// no agent ever wrote rules) read as empty: everything open.
type policyView struct {
	maps   *Maps
	states map[uint32]EndpointState
	rules  RuleSet
}

// readPolicy reads the policy maps (read-only); close releases them.
func readPolicy(ctx *view.Context) (v *policyView, close func(), err error) {
	ms, close, err := ctx.OpenMaps(Names...)
	if err != nil {
		return nil, nil, err
	}
	v = &policyView{maps: FromMaps(ms, false), states: map[uint32]EndpointState{}, rules: RuleSet{}}
	if v.maps.EndpointMap != nil {
		if v.states, err = v.maps.EndpointStates(); err != nil {
			close()
			return nil, nil, err
		}
	}
	if v.maps.RuleMap != nil {
		if v.rules, err = v.maps.ReadRules(); err != nil {
			close()
			return nil, nil, err
		}
	}
	return v, close, nil
}

// lookups is policy_config's switch (off when it is not pinned).
func (v *policyView) lookups() (bool, error) {
	if v.maps.ConfigMap == nil {
		return false, nil
	}
	return v.maps.Active()
}

// direction is the state of endpoint ifindex in direction d.
func (v *policyView) direction(ifindex uint32, d Direction) (PolicyDirection, error) {
	st, ok := v.states[ifindex]
	out := PolicyDirection{State: StateOpen.String()}
	if ok {
		if d == Ingress {
			out.State, out.Generation = State(st.Ingress).String(), st.IngressGen
		} else {
			out.State, out.Generation = State(st.Egress).String(), st.EgressGen
		}
	}
	if v.maps.DropMap != nil {
		n, err := v.maps.Drops(ifindex, d)
		if err != nil {
			return out, err
		}
		out.Drops = n
	}
	return out, nil
}

// endpointPolicy is both directions of endpoint ifindex.
func (v *policyView) endpointPolicy(ifindex uint32) (*EndpointPolicy, error) {
	in, err := v.direction(ifindex, Ingress)
	if err != nil {
		return nil, err
	}
	eg, err := v.direction(ifindex, Egress)
	if err != nil {
		return nil, err
	}
	return &EndpointPolicy{Ingress: in, Egress: eg}, nil
}

// policyName names a source of a rule.
func (v *policyView) policyName(id uint32) string {
	if v.maps.NameMap == nil {
		return fmt.Sprintf("policy %#x", id)
	}
	return v.maps.NameOf(id)
}

// protoName names the protocols a rule's ports hold.
func protoName(p uint8) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	}
	return view.ProtoName(p)
}

// rulesOf are the rules of endpoint ifindex for d, by peer: IPv4 first,
// then by address and prefix length.
func (v *policyView) rulesOf(ifindex uint32, d Direction) []PolicyRule {
	entries := slices.Clone(v.rules[ifindex][d])
	slices.SortFunc(entries, func(a, b Entry) int {
		if c := a.Prefix.Addr().Compare(b.Prefix.Addr()); c != 0 {
			return c
		}
		return cmp.Compare(a.Prefix.Bits(), b.Prefix.Bits())
	})
	out := make([]PolicyRule, 0, len(entries))
	for _, e := range entries {
		r := PolicyRule{Peer: e.Prefix.String(), AllPorts: e.Rule.Flags&uint8(maps.CniPolicyRuleFlagsPOLICY_F_ALL_PORTS) != 0,
			Ports: []PolicyPort{}, Policies: []string{}}
		r.Tiered = tiered(&e.Rule)
		for _, p := range e.Rule.Ports[:min(int(e.Rule.N_ports), len(e.Rule.Ports))] {
			pp := PolicyPort{Protocol: protoName(p.Proto), First: p.First, Last: p.Last,
				Denied: p.Src&uint8(maps.CniPolicyPortSrcPOLICY_PORT_DENIED) != 0}
			if r.Tiered {
				pp.Decision = v.decision(&e.Rule, p.Src&uint8(maps.CniPolicyPortSrcPOLICY_PORT_SRC), !pp.Denied)
			}
			r.Ports = append(r.Ports, pp)
		}
		if r.Tiered {
			allowed := e.Rule.Flags&uint8(maps.CniPolicyRuleFlagsPOLICY_F_EXCEPT_PORTS|maps.CniPolicyRuleFlagsPOLICY_F_ALL_PORTS) != 0
			r.Others = map[bool]string{true: "allow", false: "deny"}[allowed]
			r.OthersDecision = v.decision(&e.Rule, e.Rule.Rest, allowed)
		}
		n := int(e.Rule.N_sources)
		for _, id := range e.Rule.Sources[:min(n, len(e.Rule.Sources))] {
			r.Policies = append(r.Policies, v.policyName(id))
		}
		r.MorePolicies = max(n-len(e.Rule.Sources), 0)
		r.MaybeMore = n == len(e.Rule.Sources)
		out = append(out, r)
	}
	return out
}

// tiered: the entry was compiled with ClusterNetworkPolicies (ranges
// with verdicts and sources).
func tiered(r *Rule) bool {
	if r.Flags&uint8(maps.CniPolicyRuleFlagsPOLICY_F_EXCEPT_PORTS) != 0 || r.Rest != 0 {
		return true
	}
	for _, p := range r.Ports[:min(int(r.N_ports), len(r.Ports))] {
		if p.Src != 0 {
			return true
		}
	}
	return false
}

// decision says what decided a range of rule r: src is 1 + the index of
// its source (0: none, the default), allowed its verdict.
func (v *policyView) decision(r *Rule, src uint8, allowed bool) *PolicyDecision {
	if src == 0 || int(src) > int(r.N_sources) || int(src) > len(r.Sources) {
		if allowed {
			return &PolicyDecision{Action: "default"}
		}
		return &PolicyDecision{Action: "deny"}
	}
	id := r.Sources[src-1]
	d := &PolicyDecision{Policy: v.policyName(id), Action: map[bool]string{true: "allow", false: "deny"}[allowed]}
	if v.maps.NameMap == nil {
		return d
	}
	s, ok := v.maps.SourceOf(id)
	if !ok {
		return d
	}
	d.Tier = s.Tier.String()
	if s.Tier == TierNetworkPolicy {
		d.Policy = s.Namespace + "/" + s.Name
		return d
	}
	d.Policy = s.Name
	prio := int(s.Priority)
	d.Priority = &prio
	d.Action = map[bool]string{true: "Accept", false: "Deny"}[allowed]
	return d
}

// node is the node's summary; its Endpoints are counted by the caller.
func (v *policyView) node() (PolicyNode, error) {
	out := PolicyNode{Namespaces: []PolicyNamespace{}}
	var err error
	if out.Lookups, err = v.lookups(); err != nil {
		return out, err
	}
	for _, st := range v.states {
		in, eg := State(st.Ingress) != StateOpen, State(st.Egress) != StateOpen
		if in {
			out.Isolated.Ingress++
		}
		if eg {
			out.Isolated.Egress++
		}
		if in || eg {
			out.Isolated.Any++
		}
	}
	if v.maps.NamespaceMap == nil {
		return out, nil
	}
	facts, err := v.maps.NamespaceFacts()
	if err != nil {
		return out, err
	}
	for _, ns := range slices.Sorted(xmaps.Keys(facts)) {
		out.Namespaces = append(out.Namespaces, PolicyNamespace{Namespace: ns, Ingress: facts[ns].Ingress, Egress: facts[ns].Egress})
	}
	return out, nil
}

// endpoint is the endpoint e with both its directions and their rules.
func (v *policyView) endpoint(e *view.EndpointRef) (*PolicyEndpoint, error) {
	out := &PolicyEndpoint{ContainerID: e.ContainerID, IfName: e.IfName, HostVeth: e.HostVeth, HostIfIndex: e.HostIfIndex, IPs: e.IPs}
	if e.PodName != "" {
		out.Pod = &node.Pod{Namespace: e.PodNamespace, Name: e.PodName, UID: e.PodUID}
	}
	if out.IPs == nil {
		out.IPs = []string{}
	}
	idx := uint32(e.HostIfIndex)
	for _, d := range []Direction{Ingress, Egress} {
		dir, err := v.direction(idx, d)
		if err != nil {
			return nil, err
		}
		r := PolicyRules{PolicyDirection: dir, Rules: v.rulesOf(idx, d)}
		if d == Ingress {
			out.Ingress = r
		} else {
			out.Egress = r
		}
	}
	return out, nil
}

func readPolicyOutput(ctx *view.Context, o policyOpts) (*PolicyOutput, error) {
	eps, err := ctx.Endpoints()
	if err != nil {
		return nil, err
	}
	v, closeMaps, err := readPolicy(ctx)
	if err != nil {
		return nil, err
	}
	defer closeMaps()
	out := &PolicyOutput{Endpoints: []*PolicyEndpoint{}}
	if out.Node, err = v.node(); err != nil {
		return nil, err
	}
	// States and rules of an ifindex that is no endpoint: left by a pod
	// removed without DEL (gc removes them), or written by the agent for a
	// pod whose ADD has not finished.
	known := map[uint32]bool{}
	for _, e := range eps {
		known[uint32(e.HostIfIndex)] = true
	}
	var others []int
	for idx := range v.states {
		if !known[idx] {
			others = append(others, int(idx))
		}
	}
	for idx := range v.rules {
		if _, state := v.states[idx]; !known[idx] && !state {
			others = append(others, int(idx))
		}
	}
	slices.Sort(others)
	for _, idx := range others {
		eps = append(eps, view.EndpointRef{HostIfIndex: idx})
	}
	for _, e := range eps {
		out.Node.Endpoints++
		if !o.wants(&e) {
			continue
		}
		pe, err := v.endpoint(&e)
		if err != nil {
			return nil, err
		}
		out.Endpoints = append(out.Endpoints, pe)
	}
	return out, nil
}

func runPolicy(ctx *view.Context, o policyOpts) error {
	out, err := readPolicyOutput(ctx, o)
	if err != nil {
		return err
	}
	if len(out.Endpoints) == 0 && (o.pod != "" || o.veth != "") {
		return errors.New("no endpoint on this node matches --pod or --veth (see ebpf-cni endpoints)")
	}
	if ctx.JSON {
		return view.WriteJSON(ctx.Stdout, out)
	}
	fmt.Fprintln(ctx.Stdout, out.Node.line())
	if len(out.Endpoints) == 0 {
		fmt.Fprintln(ctx.Stdout, "no endpoints on this node")
		return nil
	}
	fmt.Fprintln(ctx.Stdout)
	t := &view.Table{Header: []string{"POD", "HOST VETH", "IPS", "DIRECTION", "STATE", "GEN", "DROPS", "PEER", "PORTS", "POLICIES"},
		Right: map[int]bool{5: true, 6: true}}
	for _, e := range out.Endpoints {
		pod, veth, ips := "-", view.OrDash(e.HostVeth), view.OrDash(strings.Join(e.IPs, ","))
		switch {
		case e.Pod != nil:
			pod = e.Pod.String()
		case e.ContainerID != "":
			pod = view.Name(e.ContainerID, e.IfName)
		}
		if e.ContainerID == "" && e.Pod == nil {
			veth = fmt.Sprintf("(ifindex %d)", e.HostIfIndex)
		}
		for _, d := range []struct {
			name string
			r    *PolicyRules
		}{{"ingress", &e.Ingress}, {"egress", &e.Egress}} {
			first := []string{pod, veth, ips, d.name, d.r.State, "-", view.HumanCount(d.r.Drops)}
			if d.r.Generation != 0 {
				first[5] = fmt.Sprint(d.r.Generation)
			}
			pod, veth, ips = "", "", ""
			switch d.r.State {
			case StateOpen.String():
				t.Row(append(first, "all peers", "all ports", "(no policy selects it)")...)
				continue
			case StateClosed.String():
				t.Row(append(first, "none", "-", "(waiting for the agent to write its rules)")...)
				continue
			}
			if len(d.r.Rules) == 0 {
				t.Row(append(first, "none", "-", "(no policy allows any peer)")...)
				continue
			}
			for i, r := range d.r.Rules {
				cells := first
				if i > 0 {
					cells = make([]string, len(first))
				}
				t.Row(append(cells, r.Peer, r.ports(), r.policies())...)
			}
		}
	}
	return t.Write(ctx.Stdout)
}

// line is the node's summary line.
func (n *PolicyNode) line() string {
	on := "off"
	if n.Lookups {
		on = "on"
	}
	ns := make([]string, 0, len(n.Namespaces))
	for _, x := range n.Namespaces {
		var dirs []string
		if x.Ingress {
			dirs = append(dirs, "ingress")
		}
		if x.Egress {
			dirs = append(dirs, "egress")
		}
		ns = append(ns, fmt.Sprintf("%s (%s)", x.Namespace, strings.Join(dirs, ", ")))
	}
	list := "none"
	if len(ns) > 0 {
		list = fmt.Sprintf("%d: %s", len(ns), strings.Join(ns, ", "))
	}
	return fmt.Sprintf("policy lookups: %s; endpoints isolated: %d of %d (ingress %d, egress %d); namespaces with policies: %s",
		on, n.Isolated.Any, n.Endpoints, n.Isolated.Ingress, n.Isolated.Egress, list)
}

// ports is how the table shows what a rule allows.
func (r *PolicyRule) ports() string {
	if r.Tiered {
		s := make([]string, 0, len(r.Ports)+1)
		for _, p := range r.Ports {
			x := fmt.Sprintf("%s/%d", p.Protocol, p.First)
			if p.Last != p.First {
				x += fmt.Sprintf("-%d", p.Last)
			}
			s = append(s, x+" "+map[bool]string{true: "deny", false: "allow"}[p.Denied])
		}
		what := "others"
		if len(r.Ports) == 0 {
			what = "all"
		}
		return strings.Join(append(s, what+" "+r.Others), ", ")
	}
	if r.AllPorts {
		return "all ports"
	}
	if len(r.Ports) == 0 {
		return "none"
	}
	s := make([]string, len(r.Ports))
	for i, p := range r.Ports {
		s[i] = fmt.Sprintf("%s/%d", p.Protocol, p.First)
		if p.Last != p.First {
			s[i] += fmt.Sprintf("-%d", p.Last)
		}
	}
	return strings.Join(s, ", ")
}

// policies is how the table shows why a rule allows it: where
// ClusterNetworkPolicies decide, what decided each range.
func (r *PolicyRule) policies() string {
	if r.Tiered {
		s := make([]string, 0, len(r.Ports)+1)
		for _, p := range r.Ports {
			x := fmt.Sprintf("%s/%d", p.Protocol, p.First)
			if p.Last != p.First {
				x += fmt.Sprintf("-%d", p.Last)
			}
			s = append(s, x+": "+p.Decision.String())
		}
		what := "others"
		if len(r.Ports) == 0 {
			what = "all"
		}
		return strings.Join(append(s, what+": "+r.OthersDecision.String()), "; ")
	}
	s := strings.Join(r.Policies, ", ")
	switch {
	case r.MorePolicies > 0:
		s += fmt.Sprintf(" +%d more", r.MorePolicies)
	case r.MaybeMore:
		s += " +maybe more"
	}
	return view.OrDash(s)
}
