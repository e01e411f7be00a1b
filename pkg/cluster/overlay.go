package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
	"github.com/ebpf-cni/ebpf-cni/pkg/rtnl"
)

// The hooks of the overlay's device.
var (
	// HookFromTunnel is the device's ingress: what the overlay
	// decapsulated, for the node's pods.
	HookFromTunnel = attach.Ingress("from_tunnel", attach.Device)
	// HookToTunnel is the device's egress: the tunnel key of what the
	// node's stack forwards into the overlay.
	HookToTunnel = attach.Egress("to_tunnel", attach.Device)
	// Hooks is every hook the overlay's device gets.
	Hooks = []attach.Hook{HookFromTunnel, HookToTunnel}
)

// objects are the overlay's programs.
func objects() []programs.Object {
	return []programs.Object{
		{Name: "from_tunnel", Bytes: _FromTunnelBytes, Load: LoadFromTunnel, Hooks: []attach.Hook{HookFromTunnel}},
		{Name: "to_tunnel", Bytes: _ToTunnelBytes, Load: LoadToTunnel, Hooks: []attach.Hook{HookToTunnel}},
	}
}

// owner groups the overlay's attachment set (node.AttachmentSet).
const owner = "tunnels"

// Device is the node's flow-based VXLAN device. Its name must not start
// with the host veths' prefix ("ec"): GC would take it for one.
const Device = "ebpfcni-vxlan"

// deviceAlias marks the device as ours, so nothing removes a device of the
// same name someone else made.
const deviceAlias = "ebpf-cni:overlay"

// Overhead of VXLAN on the underlay: outer IP, UDP (8), VXLAN (8) and the
// inner Ethernet header (14).
const (
	OverheadIPv4 = 20 + 8 + 8 + 14
	OverheadIPv6 = 40 + 8 + 8 + 14
)

// Overhead is what the overlay takes from the pods' MTU on this node: an
// IPv4 underlay when the node has an IPv4 default route, else IPv6. (With
// tunnel endpoints of both families, set mtu to the uplink's minus 70.)
func Overhead() int {
	if routes, err := rtnl.DefaultRoutes(unix.AF_INET); err == nil && len(routes) > 0 {
		return OverheadIPv4
	}
	return OverheadIPv6
}

func tunnelDir(n *node.Node) string { return n.PinPath("tunnels", Device) }

// ensureOverlay makes the node's VXLAN device (flow-based: the programs
// set each packet's tunnel key) with from_tunnel on its ingress, and tells
// the programs its ifindex and VNI. Idempotent; the first ADD of a network
// with overlay vxlan makes it, the node's last endpoint removes it
// (Release).
func ensureOverlay(n *node.Node, s *Settings, mode attach.Mode) error {
	progs, err := n.Programs()
	if err != nil {
		return err
	}
	cfg, err := n.Map(maps.CniMapClusterConfig)
	if err != nil {
		return err
	}
	ocfg, err := n.Map(maps.CniMapOverlayConfig)
	if err != nil {
		return err
	}
	lock, err := clusterLock(n)
	if err != nil {
		return err
	}
	defer lock.Unlock()
	l, err := ensureDevice(s)
	if err != nil {
		return err
	}
	if err := ensureRoutes(l, s.Ranges); err != nil {
		return err
	}
	if !attach.HooksAttached(l, Hooks, progs.IDsOf(Hooks)) {
		if err := detachOverlay(n); err != nil {
			return err
		}
		set := &node.AttachmentSet{Owner: owner, Name: Device, IfIndex: l.Attrs().Index}
		for _, h := range Hooks {
			prog, err := progs.Prog(h.Name)
			var a attach.Attachment
			if err == nil {
				a, err = attach.Attach(mode, l, h, prog, tunnelDir(n))
			}
			if err != nil {
				for _, done := range set.Attachments {
					_ = attach.DetachNow(done, set.IfIndex, hook(done.Hook))
				}
				_ = os.RemoveAll(tunnelDir(n))
				return fmt.Errorf("attaching %s to %s: %w", h.Name, Device, err)
			}
			set.Attachments = append(set.Attachments, a)
		}
		if err := n.SaveAttachments(set); err != nil {
			return err
		}
	}
	v := maps.CniClusterSettings{VxlanIfindex: uint32(l.Attrs().Index), Vni: s.VNI}
	if err := cfg.Put(uint32(0), &v); err != nil {
		return fmt.Errorf("writing %s: %w", maps.CniMapClusterConfig, err)
	}
	wire := overlayWire(s)
	if err := ocfg.Put(uint32(0), &wire); err != nil {
		return fmt.Errorf("writing %s: %w", maps.CniMapOverlayConfig, err)
	}
	return nil
}

// overlayWire is how the overlay's packets look (overlay_config, which
// from_netdev matches them with to decapsulate them itself): its UDP port
// and the VXLAN header's VNI word, in network byte order.
func overlayWire(s *Settings) maps.CniOverlaySettings {
	var port [2]byte
	var vni [4]byte
	binary.BigEndian.PutUint16(port[:], s.Port)
	binary.BigEndian.PutUint32(vni[:], s.VNI<<8)
	return maps.CniOverlaySettings{Port: binary.NativeEndian.Uint16(port[:]), VniWord: binary.NativeEndian.Uint32(vni[:])}
}

func hook(name string) attach.Hook { return attach.Find(Hooks, name) }

// ensureDevice returns the device, made (or remade when its port is not
// the configured one) and up.
func ensureDevice(s *Settings) (netlink.Link, error) {
	l, err := rtnl.H().LinkByName(Device)
	if err == nil {
		vx, ok := l.(*netlink.Vxlan)
		if !ok || l.Attrs().Alias != deviceAlias {
			return nil, fmt.Errorf("device %s exists and is not ebpf-cni's overlay (type %s, alias %q)", Device, l.Type(), l.Attrs().Alias)
		}
		if vx.FlowBased && vx.Port == int(s.Port) {
			if l.Attrs().Flags&net.FlagUp == 0 {
				if err := rtnl.H().LinkSetUp(l); err != nil {
					return nil, fmt.Errorf("setting %s up: %w", Device, err)
				}
			}
			return l, nil
		}
		if err := rtnl.H().LinkDel(l); err != nil {
			return nil, fmt.Errorf("replacing %s (port %d, want %d): %w", Device, vx.Port, s.Port, err)
		}
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name = Device
	vx := &netlink.Vxlan{LinkAttrs: attrs, FlowBased: true, Port: int(s.Port), Learning: false}
	if err := rtnl.H().LinkAdd(vx); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("creating %s: %w", Device, err)
	}
	l, err = rtnl.H().LinkByName(Device)
	if err != nil {
		return nil, fmt.Errorf("looking up %s: %w", Device, err)
	}
	if err := rtnl.H().LinkSetAlias(l, deviceAlias); err != nil {
		return nil, fmt.Errorf("setting the alias of %s: %w", Device, err)
	}
	// Nobody answers ARP or NDP in the overlay: to_tunnel sets the key and
	// from_tunnel on the other node rewrites the inner frame's addresses.
	if err := rtnl.H().LinkSetARPOff(l); err != nil {
		return nil, fmt.Errorf("setting %s noarp: %w", Device, err)
	}
	if err := rtnl.H().LinkSetUp(l); err != nil {
		return nil, fmt.Errorf("setting %s up: %w", Device, err)
	}
	return l, nil
}

// overlayRoutes are the node's routes of the cluster's ranges through the
// overlay's device: what the node's stack forwards to another node's pod
// (kube-proxy's DNAT to a backend there) reaches to_tunnel. The node's own
// pods (host routes) and other nodes' ranges routed directly (the node
// agent's routes) are more specific.
func overlayRoutes(l netlink.Link, ranges []*net.IPNet) []*netlink.Route {
	var out []*netlink.Route
	for _, n := range ranges {
		out = append(out, &netlink.Route{LinkIndex: l.Attrs().Index, Dst: n, Scope: netlink.SCOPE_LINK})
	}
	return out
}

func ensureRoutes(l netlink.Link, ranges []*net.IPNet) error {
	for _, r := range overlayRoutes(l, ranges) {
		if err := rtnl.H().RouteReplace(r); err != nil {
			return fmt.Errorf("routing %s through %s: %w", r.Dst, Device, err)
		}
	}
	return nil
}

// detachOverlay removes what the overlay's attachment set says was
// attached; idempotent.
func detachOverlay(n *node.Node) error {
	sets, err := n.AttachmentSets(owner)
	if err != nil {
		return err
	}
	var errs []error
	for _, set := range sets {
		for _, a := range set.Attachments {
			if err := attach.DetachNow(a, set.IfIndex, hook(a.Hook)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		if len(errs) == 0 {
			errs = append(errs, n.RemoveAttachments(owner, set.Name))
		}
	}
	if err := os.RemoveAll(tunnelDir(n)); err != nil {
		errs = append(errs, fmt.Errorf("unpinning links of %s: %w", Device, err))
	}
	return errors.Join(errs...)
}

// teardownOverlay removes the overlay's programs, device and settings.
func teardownOverlay(n *node.Node) error {
	lock, err := clusterLock(n)
	if err != nil {
		return err
	}
	defer lock.Unlock()
	errs := []error{detachOverlay(n)}
	if l, err := rtnl.H().LinkByName(Device); err == nil && l.Attrs().Alias == deviceAlias {
		if err := rtnl.H().LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("deleting %s: %w", Device, err))
		}
	}
	if n.CheckBPFFS() == nil {
		m, err := n.PinnedMap(maps.CniMapClusterConfig)
		if err == nil && m != nil {
			err = m.Put(uint32(0), &maps.CniClusterSettings{})
		}
		errs = append(errs, err)
		if m, err = n.PinnedMap(maps.CniMapOverlayConfig); err == nil && m != nil {
			err = m.Put(uint32(0), &maps.CniOverlaySettings{})
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// OverlayProblems names what is missing for the overlay, for CHECK.
func overlayProblems(n *node.Node, s *Settings) []string {
	l, err := rtnl.H().LinkByName(Device)
	if err != nil {
		return []string{fmt.Sprintf("overlay device %s missing", Device)}
	}
	var out []string
	if vx, ok := l.(*netlink.Vxlan); !ok || !vx.FlowBased || vx.Port != int(s.Port) {
		out = append(out, fmt.Sprintf("%s is not a flow-based VXLAN device on port %d", Device, s.Port))
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		out = append(out, fmt.Sprintf("overlay device %s is down", Device))
	}
	if progs, err := n.PinnedPrograms(); err != nil {
		out = append(out, err.Error())
	} else if !attach.HooksAttached(l, Hooks, progs.IDsOf(Hooks)) {
		out = append(out, fmt.Sprintf("the overlay programs are not attached to %s", Device))
	}
	for _, r := range overlayRoutes(l, s.Ranges) {
		fam := netlink.FAMILY_V4
		if r.Dst.IP.To4() == nil {
			fam = netlink.FAMILY_V6
		}
		routes, err := rtnl.H().RouteListFiltered(fam, r, netlink.RT_FILTER_DST|netlink.RT_FILTER_OIF)
		if err != nil || len(routes) == 0 {
			out = append(out, fmt.Sprintf("route %s dev %s missing", r.Dst, Device))
		}
	}
	m, err := n.Map(maps.CniMapClusterConfig)
	if err != nil {
		return append(out, err.Error())
	}
	var v maps.CniClusterSettings
	if err := m.Lookup(uint32(0), &v); err != nil || int(v.VxlanIfindex) != l.Attrs().Index || v.Vni != s.VNI {
		out = append(out, fmt.Sprintf("%s does not point at %s (ifindex %d) with VNI %d", maps.CniMapClusterConfig, Device, l.Attrs().Index, s.VNI))
	}
	om, err := n.Map(maps.CniMapOverlayConfig)
	if err != nil {
		return append(out, err.Error())
	}
	var ov maps.CniOverlaySettings
	if err := om.Lookup(uint32(0), &ov); err != nil || ov != overlayWire(s) {
		out = append(out, fmt.Sprintf("%s does not say port %d and VNI %d", maps.CniMapOverlayConfig, s.Port, s.VNI))
	}
	return out
}

// release undoes the cluster's node-wide state with the node's last
// endpoint: the overlay's device and programs, the cluster ranges. Tunnel
// endpoints stay: they are the node agent's, and the next pod needs them.
func release(n *node.Node) error {
	errs := []error{teardownOverlay(n)}
	// A node without the map has no range to clear: opening it would
	// make it (an uninstall run twice would find a pin it made itself).
	if n.CheckBPFFS() == nil && n.HasMap(maps.CniMapClusterRoutes) {
		errs = append(errs, clearRanges(n))
	}
	return errors.Join(errs...)
}
