package cli

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

// Endpoint is one attachment as the node holds it: its record under
// stateDir joined with its endpoint_devs entry (by host ifindex) and what is
// attached to its host veth. JSON field names are stable.
type Endpoint struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
	// Pod is the pod's Kubernetes identity (endpoint_pods, else the
	// record): absent when the runtime passed no K8S_POD_* in CNI_ARGS.
	Pod         *node.Pod `json:"pod,omitempty"`
	Network     string    `json:"network"`
	NetNS       string    `json:"netns"`
	HostVeth    string    `json:"hostVeth"`
	HostIfIndex int       `json:"hostIfindex"`
	IPs         []string  `json:"ips"`
	MAC         string    `json:"mac"`
	// PodMAC is the MAC the pod's interface has now, when it is not the
	// one the datapath enforces (MAC): a later plugin changed it.
	PodMAC  string `json:"podMAC,omitempty"`
	HostMAC string `json:"hostMAC"`
	// Device is the pair's device type: veth or netkit (empty when the
	// host end is not here).
	Device      string     `json:"device,omitempty"`
	Attachments []Attached `json:"attachments"`
	Recorded    bool       `json:"recorded"`    // has a record under stateDir
	InMaps      bool       `json:"inMaps"`      // has an endpoint_devs entry
	VethPresent bool       `json:"vethPresent"` // host veth found in this netns
	Problems    []string   `json:"problems"`
	// Qdiscs are the host veth's qdiscs other than its default noqueue
	// and ebpf-cni's own clsact: another plugin's shaping, which the
	// programs hand the pod's traffic to (bpf/lib/qdisc.h).
	Qdiscs []string `json:"qdiscs"`
	// ViaQdisc: the datapath has learned that the root qdisc queues
	// (EP_F_QDISC) and delivers to the pod through it.
	ViaQdisc bool `json:"viaQdisc"`

	rec    *node.Record
	clsact bool // endpoint_devs says its programs are tc filters (EP_F_CLSACT)
}

// Attached is what runs at one hook of an endpoint's host veth.
type Attached struct {
	Hook         string   `json:"hook"`
	Mode         string   `json:"mode"`         // tcx or tc as found on the device; recorded mode if the device is gone
	RecordedMode string   `json:"recordedMode"` // as ADD recorded it
	ProgramIDs   []uint32 `json:"programIDs"`   // kernel IDs found attached
	ProgramTag   string   `json:"programTag"`   // the pinned tag these programs belong to, if any
}

// Name is how tables name the endpoint: containerID/ifname (the ID cut to
// 12 characters, as container runtimes show it).
func (e *Endpoint) Name() string { return view.Name(e.ContainerID, e.IfName) }

// snapshot is the node's endpoints and programs.
type snapshot struct {
	Endpoints []*Endpoint
	byIfIndex map[int]*Endpoint
	Tags      []string                     // installed program tags
	programs  map[ebpf.ProgramID][2]string // id -> tag, hook
}

// loadNode reads records, endpoint maps, pinned programs and the host veths
// of this netns. It only reads: entries appearing or vanishing meanwhile
// (an ADD or DEL running) show as the half they are.
func loadNode(ctx *Context) (*snapshot, error) {
	if err := ctx.CheckRoot(); err != nil {
		return nil, err
	}
	recs, err := ctx.Node.Records()
	if err != nil {
		return nil, fmt.Errorf("reading endpoint records (--state-dir): %w", err)
	}
	devs, pods, err := readEndpointMaps(ctx)
	if err != nil {
		return nil, err
	}
	n := &snapshot{byIfIndex: map[int]*Endpoint{}, programs: map[ebpf.ProgramID][2]string{}}
	if err := n.readPrograms(ctx); err != nil {
		return nil, err
	}
	for _, r := range recs {
		e := &Endpoint{ContainerID: r.ContainerID, IfName: r.IfName, Network: r.Network, NetNS: r.NetNS,
			HostVeth: r.HostIfName, HostIfIndex: r.HostIfIndex, MAC: r.MAC, HostMAC: r.HostMAC, Recorded: true, rec: r}
		for _, ip := range r.Addrs() {
			e.IPs = append(e.IPs, ip.String())
		}
		if d, ok := devs[r.HostIfIndex]; ok && maps.GoString(d.ContainerId[:]) == r.ContainerID {
			e.fromDev(&d)
			delete(devs, r.HostIfIndex)
		}
		n.add(e)
	}
	for idx, d := range devs {
		e := &Endpoint{HostIfIndex: idx}
		e.fromDev(&d)
		n.add(e)
	}
	for _, e := range n.Endpoints {
		if p, ok := pods[uint32(e.HostIfIndex)]; ok {
			e.Pod = &p
		} else if e.rec != nil {
			e.Pod = e.rec.Pod
		}
	}
	eps, err := ctx.OpenMap(maps.CniMapEndpoints)
	if err != nil && !errors.Is(err, errNoMap) {
		return nil, err
	}
	for _, e := range n.Endpoints {
		n.inspect(e, ctx)
		if eps != nil {
			e.ViaQdisc = viaQdisc(eps, e)
		}
	}
	if eps != nil {
		eps.Close()
	}
	sort.Slice(n.Endpoints, func(i, j int) bool {
		a, b := n.Endpoints[i], n.Endpoints[j]
		if a.ContainerID != b.ContainerID {
			return a.ContainerID < b.ContainerID
		}
		if a.IfName != b.IfName {
			return a.IfName < b.IfName
		}
		return a.HostIfIndex < b.HostIfIndex
	})
	return n, nil
}

// readEndpointMaps reads endpoint_devs and endpoint_pods, by host ifindex;
// a map not pinned yet is empty.
func readEndpointMaps(ctx *Context) (map[int]maps.CniEndpointDev, map[uint32]endpoint.Pod, error) {
	devs := map[int]maps.CniEndpointDev{}
	m, err := ctx.OpenMap(maps.CniMapEndpointDevs)
	if err != nil && !errors.Is(err, errNoMap) {
		return nil, nil, err
	}
	if m != nil {
		err := maps.Walk(m, func(k *uint32, d *maps.CniEndpointDev) { devs[int(*k)] = *d })
		m.Close()
		if err != nil {
			return nil, nil, fmt.Errorf("reading %s: %w", maps.CniMapEndpointDevs, err)
		}
	}
	pods := map[uint32]endpoint.Pod{}
	if m, err := ctx.OpenMap(maps.CniMapEndpointPods); err == nil {
		pods, err = endpoint.ReadPods(m)
		m.Close()
		if err != nil {
			return nil, nil, err
		}
	} else if !errors.Is(err, errNoMap) {
		return nil, nil, err
	}
	return devs, pods, nil
}

// readPrograms reads the program sets pinned on the node, and the kernel
// IDs of their programs.
func (n *snapshot) readPrograms(ctx *Context) error {
	var err error
	if n.Tags, err = programs.Installed(ctx.Node.BPFRoot()); err != nil {
		return err
	}
	sort.Strings(n.Tags)
	for _, tag := range n.Tags {
		p, err := programs.Open(ctx.Node.BPFRoot(), tag, features.Objects())
		if err != nil {
			continue // being unpinned by an upgrade, or half pinned: status reports the tag
		}
		for id, hook := range p.IDs() {
			n.programs[id] = [2]string{tag, hook}
		}
		p.Close()
	}
	return nil
}

func (n *snapshot) add(e *Endpoint) {
	n.Endpoints = append(n.Endpoints, e)
	n.byIfIndex[e.HostIfIndex] = e
}

// fromDev takes what the datapath sees: its addresses and MACs win over the
// record's, since they are what the programs enforce.
func (e *Endpoint) fromDev(d *maps.CniEndpointDev) {
	e.InMaps = true
	e.clsact = uint32(d.Flags)&uint32(maps.CniEndpointFlagsEP_F_CLSACT) != 0
	e.ContainerID = maps.GoString(d.ContainerId[:])
	e.IfName = maps.GoString(d.Ifname[:])
	e.MAC = net.HardwareAddr(d.Mac[:]).String()
	e.HostMAC = net.HardwareAddr(d.HostMac[:]).String()
	e.IPs = nil
	for _, ip := range maps.EndpointIPs(d) {
		e.IPs = append(e.IPs, ip.String())
	}
}

// inspect finds the host veth and what is attached to it, and names every
// problem with what to do about it.
func (n *snapshot) inspect(e *Endpoint, ctx *Context) {
	var l netlink.Link
	if e.HostVeth != "" {
		if got, err := netlinksafe.LinkByName(e.HostVeth); err == nil && veth.IsOurs(got) {
			l = got
		}
	} else if got, err := netlink.LinkByIndex(e.HostIfIndex); err == nil && veth.IsOurs(got) {
		l = got
		e.HostVeth = got.Attrs().Name
	}
	e.VethPresent = l != nil
	if l != nil {
		e.Device = string(veth.KindOf(l))
	}
	recorded := map[string]attach.Attachment{}
	if e.rec != nil {
		for _, a := range e.rec.Attachments {
			recorded[a.Hook] = a
		}
	}
	for _, h := range endpointHooks(l) {
		e.Attachments = append(e.Attachments, n.attached(e, l, h, recorded[h.Name]))
	}
	e.Qdiscs = []string{}
	if l != nil {
		qs, err := netlinksafe.QdiscList(l)
		if err != nil {
			e.Problems = append(e.Problems, fmt.Sprintf("listing the qdiscs of %s: %v", l.Attrs().Name, err))
		}
		for _, q := range qs {
			e.Qdiscs = append(e.Qdiscs, otherQdisc(q, e.Attachments)...)
		}
	}
	if e.VethPresent && e.InMaps && e.NetNS != "" && e.IfName != "" {
		if mac := podMAC(e.NetNS, e.IfName); mac != "" && !strings.EqualFold(mac, e.MAC) {
			e.PodMAC = mac
			e.Problems = append(e.Problems, fmt.Sprintf("%s in the pod has MAC %s, the datapath enforces %s: every packet of the pod is dropped (drop_spoof_mac); a plugin after ebpf-cni changed it (tuning with mac): give the MAC to ebpf-cni instead (runtimeConfig.mac, args.cni.mac or CNI_ARGS MAC)",
				e.IfName, mac, e.MAC))
		}
	}
	if !e.VethPresent {
		e.Problems = append(e.Problems, fmt.Sprintf("host veth %s not in this network namespace (pod gone without DEL, or run ebpf-cni in the node's netns): the next CNI STATUS or ADD reclaims it; ebpf-cni repair (or gc) does it now", orDash(e.HostVeth)))
	}
	if e.Recorded && !e.InMaps {
		e.Problems = append(e.Problems, "no endpoint_devs entry: the datapath drops the pod's packets (drop_no_endpoint); DEL and ADD the pod again")
	}
	if !e.Recorded {
		if e.VethPresent {
			e.Problems = append(e.Problems, fmt.Sprintf("no record under %s/endpoints, but its host veth is alive (the stateDir was wiped or remounted, a call was killed, or --state-dir is not the plugin's stateDir): the next CNI STATUS rebuilds it from the kernel; ebpf-cni repair does it now", ctx.StateDir))
		} else {
			e.Problems = append(e.Problems, fmt.Sprintf("no record under %s/endpoints and no host veth (its pod gone without DEL while the stateDir was lost, or a crash): the next CNI STATUS or ADD in the node's network namespace reclaims its entries and addresses; ebpf-cni repair (or gc) does it now", ctx.StateDir))
		}
	}
	if e.Problems == nil {
		e.Problems = []string{}
	}
	if e.IPs == nil {
		e.IPs = []string{}
	}
}

// attached is what runs at hook h of the endpoint's host veth l (nil: not
// here: what its record says), and what is wrong with it.
func (n *snapshot) attached(e *Endpoint, l netlink.Link, h attach.Hook, recorded attach.Attachment) Attached {
	a := Attached{Hook: h.Name, RecordedMode: string(recorded.Mode), ProgramIDs: []uint32{}}
	if l == nil {
		a.Mode = a.RecordedMode
		return a
	}
	tcx, tc, err := attachedByMode(l, h)
	if err != nil {
		e.Problems = append(e.Problems, fmt.Sprintf("%s: %v", h.Name, err))
	}
	switch {
	case len(tcx) > 0 && h.Netkit != 0:
		a.Mode = string(attach.ModeNetkit)
	case len(tcx) > 0:
		a.Mode = string(attach.ModeTCX)
	case len(tc) > 0:
		a.Mode = string(attach.ModeTC)
	}
	for _, id := range append(tcx, tc...) {
		a.ProgramIDs = append(a.ProgramIDs, uint32(id))
		if p, ok := n.programs[id]; ok && p[1] == h.Name {
			a.ProgramTag = p[0]
		} else {
			e.Problems = append(e.Problems, fmt.Sprintf("%s runs program %d, which is not one of the pinned programs (%s): DEL and ADD the pod again",
				h.Name, id, strings.Join(n.Tags, ", ")))
		}
	}
	if len(a.ProgramIDs) == 0 {
		e.Problems = append(e.Problems, fmt.Sprintf("nothing attached at %s: the pod's packets bypass ebpf-cni; DEL and ADD the pod again", h.Name))
	}
	if a.RecordedMode != "" && a.Mode != "" && a.Mode != a.RecordedMode {
		e.Problems = append(e.Problems, fmt.Sprintf("%s is attached with %s but recorded as %s", h.Name, a.Mode, a.RecordedMode))
	}
	return a
}

// otherQdisc names q ("root tbf", "ingress") unless it is the default
// noqueue or the clsact that ebpf-cni's own tc filters live in.
func otherQdisc(q netlink.Qdisc, attached []Attached) []string {
	a := q.Attrs()
	switch {
	case q.Type() == "noqueue":
		return nil
	case q.Type() == "clsact" && slices.ContainsFunc(attached, func(x Attached) bool { return x.Mode == string(attach.ModeTC) }):
		return nil
	case a.Parent == netlink.HANDLE_ROOT:
		return []string{"root " + q.Type()}
	case a.Parent == netlink.HANDLE_INGRESS || a.Parent == netlink.HANDLE_CLSACT:
		return []string{q.Type()}
	}
	return nil // a child of another qdisc
}

// viaQdisc reports whether any endpoints entry of e has EP_F_QDISC.
func viaQdisc(m *ebpf.Map, e *Endpoint) bool {
	for _, s := range e.IPs {
		var v maps.CniEndpointInfo
		if ip := net.ParseIP(s); ip != nil && m.Lookup(maps.EndpointKey(ip), &v) == nil && v.Flags&uint32(maps.CniEndpointFlagsEP_F_QDISC) != 0 {
			return true
		}
	}
	return false
}

// attachedByMode lists the programs at hook on l, by how they are attached.
func attachedByMode(l netlink.Link, h attach.Hook) (tcx, tc []ebpf.ProgramID, err error) {
	at := h.TCXAttach
	if h.Netkit != 0 {
		at = h.Netkit
	}
	res, qerr := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: at})
	if qerr == nil {
		for _, p := range res.Programs {
			tcx = append(tcx, p.ID)
		}
	}
	all, err := attach.AttachedIDs(l, h)
	if err != nil {
		return nil, nil, err
	}
	for _, id := range all {
		if !slices.Contains(tcx, id) {
			tc = append(tc, id)
		}
	}
	return tcx, tc, nil
}

// endpointHooks are the hooks of the endpoint whose host end is l (nil:
// a veth's), whichever feature brings them.
func endpointHooks(l netlink.Link) []attach.Hook {
	return attach.EndpointHooksOf(programs.Hooks(features.Objects()), l)
}

// netkitHooks are the hooks of a netkit endpoint's host end.
func netkitHooks() []attach.Hook { return programs.HooksAt(features.Objects(), attach.NetkitEndpoint) }

// endpointRefs names the node's endpoints, for the features' commands.
func endpointRefs(ctx *Context) ([]view.EndpointRef, error) {
	n, err := loadNode(ctx)
	if err != nil {
		return nil, err
	}
	return n.refs(), nil
}

// refs name the endpoints of the snapshot, in its order.
func (n *snapshot) refs() []view.EndpointRef {
	out := make([]view.EndpointRef, 0, len(n.Endpoints))
	for _, e := range n.Endpoints {
		r := view.EndpointRef{ContainerID: e.ContainerID, IfName: e.IfName, HostVeth: e.HostVeth, HostIfIndex: e.HostIfIndex, IPs: e.IPs}
		if e.Pod != nil {
			r.PodNamespace, r.PodName, r.PodUID = e.Pod.Namespace, e.Pod.Name, e.Pod.UID
		}
		out = append(out, r)
	}
	return out
}

// podMAC is the MAC of ifName in the netns at path, "" when it cannot be
// read (the pod is gone: reported otherwise).
func podMAC(path, ifName string) string {
	podNS, err := ns.GetNS(path)
	if err != nil {
		return ""
	}
	defer podNS.Close()
	var mac string
	_ = podNS.Do(func(ns.NetNS) error {
		if l, err := netlinksafe.LinkByName(ifName); err == nil {
			mac = veth.MAC(l)
		}
		return nil
	})
	return mac
}
