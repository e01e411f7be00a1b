package bandwidth

import (
	"fmt"

	"github.com/ebpf-cni/ebpf-cni/pkg/config"
	"github.com/ebpf-cni/ebpf-cni/pkg/errcode"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

// Feature is bandwidth: the pod's rate limits, and source pacing.
type Feature struct{ feature.Base }

// name keys the feature's state in endpoint records.
const name = "bandwidth"

var _ feature.Feature = Feature{}

// Name is the feature's name.
func (Feature) Name() string { return name }

// Programs are the pacing hook's.
func (Feature) Programs() []programs.Object {
	return []programs.Object{{Name: "sock_pacing", Bytes: _SockPacingBytes, Load: LoadSockPacing, Hooks: PacingHooks}}
}

// netConf holds the keys of the feature.
type netConf struct {
	// The reference bandwidth plugin's keys at the top level: limits for
	// every pod of the network (they win over runtimeConfig.bandwidth, as
	// in the reference plugin).
	Entry
	// Where the pacing hook attaches (hostPort's hooks do too).
	feature.CgroupKeys
	RuntimeConfig struct {
		Bandwidth *Entry `json:"bandwidth,omitempty"` // the bandwidth capability
	} `json:"runtimeConfig,omitempty"`
}

// Parse reads the limits (top level, else runtimeConfig.bandwidth) and,
// with limits, cgroupPath.
func (Feature) Parse(conf []byte) (feature.Pod, error) {
	var c netConf
	if err := feature.Decode(conf, &c); err != nil {
		return nil, err
	}
	l, err := Validate(&c.Entry, c.RuntimeConfig.Bandwidth)
	if err != nil {
		return nil, err
	}
	p := pod{limits: l, keys: c.CgroupKeys}
	if l.Any() {
		// The pacing hook attaches where the hostPort hooks do.
		p.cgroup, err = c.CgroupKeys.Resolve()
		if _, bad := config.AsCNI(err); bad {
			return nil, err
		} else if err != nil {
			return nil, fail(fmt.Errorf("finding the cgroup v2 hierarchy for the pacing hook: %w", err))
		}
	}
	return p, nil
}

type pod struct {
	limits *Limits
	cgroup string
	keys   feature.CgroupKeys // for a record rebuilt without its limits' cgroup (Rebuild)
}

func (p pod) Needs() feature.Needs {
	return feature.Needs{Flags: maps.CniEndpointFlags(p.limits.Flags())}
}

func fail(err error) error {
	return feature.Fail(errcode.Bandwidth, "setting up bandwidth limits", err)
}

// Add writes the pod's buckets, full (an ingress limit first tries fq on
// the host veth for departure-time pacing of the stack path), records the
// pod's netns as one of the node's (its TCP senders may be paced to a
// limited pod's rate), and with limits of its own attaches the pacing hook
// to the cgroup unless it is there.
func (p pod) Add(n *node.Node, ep *feature.Endpoint, undo *feature.Undo) error {
	if p.limits.Any() {
		edt := p.limits.Ingress.Rate > 0 && EnableEDT(ep.Host)
		t, err := TableOf(n)
		if err != nil {
			return fail(err)
		}
		if err := t.Put(ep.HostIfIndex, p.limits, edt); err != nil {
			return fail(err)
		}
		undo.Push(func() error { return t.Delete(ep.HostIfIndex) })
	}
	nt, err := NetnsOf(n)
	if err != nil {
		return fail(err)
	}
	undo.Push(func() error { return nt.Forget(func(i int) bool { return i == ep.HostIfIndex }) })
	if err := nt.Register(ep.PodNS, ep.HostIfIndex); err != nil {
		return fail(err)
	}
	if !p.limits.Any() {
		return nil
	}
	if err := ep.SetFeature(name, &recorded{Limits: p.limits, Cgroup: p.cgroup}); err != nil {
		return fail(err)
	}
	return fail(StartPacing(n, p.cgroup))
}

// Check verifies the pod's buckets and the endpoint flags that make the
// programs use them against the configured limits and, with limits, the
// pod's netns entry and the pacing hook.
func (p pod) Check(n *node.Node, ep *feature.Endpoint) []string {
	t, err := TableOf(n)
	if err != nil {
		return []string{err.Error()}
	}
	problems := t.Check(ep.HostIfIndex, p.limits)
	if p.limits.Any() {
		// (A pod without limits that is missing there only sends its TCP
		// to limited pods unpaced: policed, as before pacing existed.)
		nt, err := NetnsOf(n)
		if err != nil {
			return append(problems, err.Error())
		}
		if ok, err := nt.Registered(ep.HostIfIndex); err != nil {
			problems = append(problems, err.Error())
		} else if !ok {
			problems = append(problems, fmt.Sprintf("the pod's netns is not in %s: its TCP is not paced", maps.CniMapLocalNetns))
		}
		if !Pacing(n) {
			problems = append(problems, "the pacing hook is not attached to the cgroup: TCP is policed, not paced")
		}
	}
	devs, err := n.Map(maps.CniMapEndpointDevs)
	if err != nil {
		return append(problems, err.Error())
	}
	var d maps.CniEndpointDev
	if devs.Lookup(uint32(ep.HostIfIndex), &d) == nil {
		const bw = uint32(maps.CniEndpointFlagsEP_F_BW_EGRESS | maps.CniEndpointFlagsEP_F_BW_INGRESS)
		if got, want := uint32(d.Flags)&bw, p.limits.Flags(); got != want {
			problems = append(problems, fmt.Sprintf("endpoint_devs[%d] has bandwidth flags %#x, want %#x", ep.HostIfIndex, got, want))
		}
	}
	return problems
}

// Del removes the pod's buckets and its netns entry (DEL runs it after the
// host veth is gone, so no program uses them any more).
func (Feature) Del(n *node.Node, ep *feature.Endpoint) error {
	if n.CheckBPFFS() != nil || ep.HostIfIndex == 0 {
		return nil
	}
	t, err := TableOf(n)
	if err != nil {
		return err
	}
	if err := t.Delete(ep.HostIfIndex); err != nil {
		return err
	}
	nt, err := NetnsOf(n)
	if err != nil {
		return err
	}
	return nt.Forget(func(i int) bool { return i == ep.HostIfIndex })
}

// GC removes the buckets and netns entries of pods that are gone.
func (Feature) GC(n *node.Node, live *feature.Live, dryRun bool) ([]string, error) {
	t, err := TableOf(n)
	if err != nil {
		return nil, err
	}
	sw := &feature.Sweep{DryRun: dryRun}
	buckets, err := t.List()
	if err != nil {
		return nil, err
	}
	for _, b := range buckets {
		if !live.IfIndex(b.IfIndex) {
			sw.Remove(fmt.Sprintf("%s[%d]", maps.CniMapBwBuckets, b.IfIndex), func() error { return t.Delete(b.IfIndex) })
		}
	}
	nt, err := NetnsOf(n)
	if err != nil {
		return nil, err
	}
	netns, err := nt.Entries()
	if err != nil {
		return nil, err
	}
	for cookie, i := range netns {
		if i != 0 && !live.IfIndex(i) {
			sw.Remove(fmt.Sprintf("%s[%#x]", maps.CniMapLocalNetns, cookie), func() error { return nt.Delete(cookie) })
		}
	}
	return sw.Result()
}

// Release takes pacing off the node.
func (Feature) Release(n *node.Node) error { return Teardown(n) }

// Commands: bandwidth.
func (Feature) Commands() []*view.Command { return []*view.Command{command} }
