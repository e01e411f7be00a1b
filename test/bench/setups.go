package main

import (
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/utils/sysctl"

	"github.com/ebpf-cni/ebpf-cni/internal/conflisttest"
	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
)

// ebpfFeatures are the features ebpf-cni implements today, beyond the L3
// datapath: "masq" (ipMasq), "hostport" (portMappings capability),
// "bandwidth" (bandwidth capability). A path whose feature is missing is
// measured for REF and RAW only, and its EBPF figure is null with the reason
// notImplemented. Enabling one is this one-line change (or the flag
// -ebpf-features); the EBPF configuration already carries the keys.
var ebpfFeatures = []string{"masq", "hostport", "bandwidth"}

var allFeatures = []string{"masq", "hostport", "bandwidth"}

const notImplemented = "not implemented in ebpf-cni yet"

// Pod subnets, one per setup, IPv4 only (the figures are per family alike).
const (
	refSubnet     = "10.210.0.0/16"
	ebpfSubnet    = "10.220.0.0/16"
	rawPairSubnet = "10.230.0.0/24" // RAW pod-to-pod: two netns, one veth
	rawPodSubnet  = "10.231.0.0/24" // RAW pod behind the node, routed, no NAT
)

// setup is REF or EBPF on its own simulated node (so iptables rules of one
// never touch the other's packets), or RAW.
type setup struct {
	name     string
	node     *nettest.Node
	cni      *nettest.CNI
	list     *libcni.NetworkConfigList
	features map[string]bool
	bpfRoot  string // EBPF's
	stateDir string // EBPF's
	pods     atomic.Int64
}

// pod is a network namespace attached by a setup.
type pod struct {
	ns ns.NetNS
	ip net.IP
	rt *libcni.RuntimeConf
}

func (s *setup) has(feature string) bool { return s.features[feature] }

// refList is Debian's chain with every feature: bridge (isGateway, ipMasq)
// + host-local + portmap + bandwidth, on iptables.
func refList(tmp string) ([]byte, error) {
	return json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": "ref", "plugins": []any{
		map[string]any{"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true,
			"ipam": map[string]any{"type": "host-local", "dataDir": filepath.Join(tmp, "host-local"),
				"ranges": []any{[]any{map[string]any{"subnet": refSubnet}}},
				"routes": []any{map[string]any{"dst": "0.0.0.0/0"}}}},
		map[string]any{"type": "portmap", "capabilities": map[string]any{"portMappings": true}},
		map[string]any{"type": "bandwidth", "capabilities": map[string]any{"bandwidth": true}},
	}})
}

// ebpfList is ebpf-cni + ebpf-ipam with the default attach mode and the
// features of ebpfFeatures switched on with the keys they are specified with.
func ebpfList(bpfRoot, stateDir, cgroup string, features map[string]bool) ([]byte, error) {
	o := conflisttest.Options{Name: "ebpf", Version: "1.0.0", BPFRoot: bpfRoot, StateDir: stateDir,
		Subnets: []string{ebpfSubnet}, Keys: map[string]any{}}
	if features["masq"] {
		o.Keys["ipMasq"] = true
	}
	if features["hostport"] {
		o.Capabilities = append(o.Capabilities, "portMappings")
		o.Keys["socketCgroupPath"] = cgroup
	}
	if features["bandwidth"] {
		o.Capabilities = append(o.Capabilities, "bandwidth")
		o.Keys["socketCgroupPath"] = cgroup
	}
	return conflisttest.Bytes(o)
}

// newSetups builds REF and EBPF, each on its own node, and RAW's node (for
// the routed pod of the masquerade and hostPort paths).
func (b *bench) newSetups() error {
	for _, name := range setups {
		s, err := b.newSetup(name, "main")
		if err != nil {
			return fmt.Errorf("setting up %s: %w", name, err)
		}
		b.setups[name] = s
	}
	return nil
}

// newSetup makes one setup on a fresh node; tag names its state (files,
// bpfRoot), so two setups of one kind share nothing.
func (b *bench) newSetup(name, tag string) (*setup, error) {
	return b.newSetupWith(name, tag, b.refBin)
}

// newSetupWith is newSetup with REF's plugins taken from refDir (Debian's,
// or the upstream build of the cni-upstream path).
func (b *bench) newSetupWith(name, tag, refDir string) (*setup, error) {
	features := map[string]bool{}
	for _, f := range b.cfg.features {
		features[f] = true
	}
	node, err := b.newNode()
	if err != nil {
		return nil, err
	}
	s := &setup{name: name, node: node, features: map[string]bool{}}
	dir := filepath.Join(b.tmp, tag, name)
	var raw []byte
	switch name {
	case REF:
		s.features = map[string]bool{"masq": true, "hostport": true, "bandwidth": true}
		raw, err = refList(dir)
	case EBPF:
		s.features = features
		s.bpfRoot, s.stateDir = filepath.Join(b.bpfs, tag), b.runDir(tag, name, "state")
		raw, err = ebpfList(s.bpfRoot, s.stateDir, b.cgroup, features)
		// Without masquerade the world needs a route back to the pods
		// (with it the route is unused); TestToWorld does the same.
		if err == nil {
			_, err = nettest.Run(node.World, "ip", "route", "add", ebpfSubnet, "via", nettest.NodeIP4.String())
		}
		if err == nil {
			err = b.leaseTranslated(s, nil)
		}
	case RAW:
		err = node.NS.Do(func(ns.NetNS) error {
			_, err := sysctl.Sysctl("net/ipv4/ip_forward", "1")
			return err
		})
		if err == nil {
			_, err = nettest.Run(node.World, "ip", "route", "add", rawPodSubnet, "via", nettest.NodeIP4.String())
		}
	}
	if err != nil {
		return nil, err
	}
	if raw != nil {
		if s.list, err = libcni.ConfListFromBytes(raw); err != nil {
			return nil, err
		}
		s.cni = nettest.NewCNI(node, []string{b.cfg.bin, refDir}, filepath.Join(dir, "cache"))
	}
	return s, nil
}

// addPod attaches a new pod through the setup's chain, passing only the
// capabilities the setup's list declares.
func (b *bench) addPod(s *setup, caps map[string]any) (*pod, time.Duration, error) {
	return b.addPodArgs(s, caps, nil)
}

// addPodArgs is addPod with CNI_ARGS (a Kubernetes pod's K8S_POD_*).
func (b *bench) addPodArgs(s *setup, caps map[string]any, args [][2]string) (*pod, time.Duration, error) {
	n, err := b.newNS()
	if err != nil {
		return nil, 0, err
	}
	id := fmt.Sprintf("%s-%d", s.name, s.pods.Add(1))
	p, d, err := s.attachArgs(n, id, caps, args)
	if err != nil {
		b.closeNS(n)
	}
	return p, d, err
}

// attach runs ADD for netns n and times it.
func (s *setup) attach(n ns.NetNS, id string, caps map[string]any) (*pod, time.Duration, error) {
	return s.attachArgs(n, id, caps, nil)
}

// attachArgs is attach with CNI_ARGS.
func (s *setup) attachArgs(n ns.NetNS, id string, caps map[string]any, args [][2]string) (*pod, time.Duration, error) {
	rt := &libcni.RuntimeConf{ContainerID: id, NetNS: n.Path(), IfName: "eth0", CapabilityArgs: caps, Args: args}
	t0 := time.Now()
	res, err := s.cni.Add(s.list, rt)
	d := time.Since(t0)
	if err != nil {
		return nil, 0, fmt.Errorf("%s ADD %s: %w", s.name, id, err)
	}
	p := &pod{ns: n, rt: rt}
	for _, ip := range res.IPs {
		if ip.Address.IP.To4() != nil {
			p.ip = ip.Address.IP.To4()
			break
		}
	}
	if p.ip == nil {
		return nil, 0, fmt.Errorf("%s ADD %s: no IPv4 address in the result", s.name, id)
	}
	return p, d, nil
}

// detach runs DEL and times it.
func (s *setup) detach(p *pod) (time.Duration, error) {
	t0 := time.Now()
	err := s.cni.Del(s.list, p.rt)
	d := time.Since(t0)
	if err != nil {
		return 0, fmt.Errorf("%s DEL %s: %w", s.name, p.rt.ContainerID, err)
	}
	return d, nil
}

// rawPair is RAW's pod-to-pod: two namespaces joined by one veth.
func (b *bench) rawPair() (client, server *pod, err error) {
	a, err := b.newNS()
	if err != nil {
		return nil, nil, err
	}
	c, err := b.newNS()
	if err != nil {
		return nil, nil, err
	}
	if err := veth(a, c, "eth0", cidr("10.230.0.1", 24), cidr("10.230.0.2", 24), false); err != nil {
		return nil, nil, fmt.Errorf("raw pair: %w", err)
	}
	return &pod{ns: a, ip: net.ParseIP("10.230.0.1").To4()}, &pod{ns: c, ip: net.ParseIP("10.230.0.2").To4()}, nil
}

// rawRouted is RAW's pod behind the node: a veth to the node, routed by the
// node's stack to and from the world with no NAT and no rules. There is one;
// the masquerade and hostPort paths share it.
func (b *bench) rawRouted() (*pod, error) {
	if b.rawPod != nil {
		return b.rawPod, nil
	}
	s := b.setups[RAW]
	n, err := b.newNS()
	if err != nil {
		return nil, err
	}
	if err := veth(s.node.NS, n, "rawpod", cidr("10.231.0.1", 24), cidr("10.231.0.2", 24), true); err != nil {
		return nil, fmt.Errorf("raw routed pod: %w", err)
	}
	b.rawPod = &pod{ns: n, ip: net.ParseIP("10.231.0.2").To4()}
	return b.rawPod, nil
}

// pick returns the setups to measure for a path needing feature ("" for
// none) and records why the others have no figure.
func (b *bench) pick(path, feature string, metrics []metricDecl, rawOK bool) []*setup {
	var out []*setup
	for _, name := range setups {
		s := b.setups[name]
		why := ""
		switch {
		case name == RAW && !rawOK:
			why = "not applicable"
		case feature != "" && name != RAW && !s.has(feature):
			why = notImplemented
		}
		if why != "" {
			for _, m := range metrics {
				b.res.skip(path, m.name, m.unit, m.better, name, why)
			}
			continue
		}
		out = append(out, s)
	}
	for _, m := range metrics {
		b.res.declare(path, m.name, m.unit, m.better)
	}
	return out
}

type metricDecl struct{ name, unit, better string }

func names(ss []*setup) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s.name)
	}
	return out
}

func contains(ss []*setup, name string) bool { return slices.Contains(names(ss), name) }
