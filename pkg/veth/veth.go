// Package veth makes the veth pair of an attachment and configures both
// ends: names and ownership, the pod's addresses and routes, the host's
// routes to the pod, the sysctls forwarding needs. Netlink only: no
// program, no map.
package veth

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/rtnl"
)

// HostPrefix starts the name of every host veth ebpf-cni creates.
const HostPrefix = "ec"

// aliasPrefix marks host veths as ours (ifalias), so GC never touches a
// device someone else named alike.
const aliasPrefix = "ebpf-cni:"

// Group is the device group (IFLA_GROUP) of every host veth ebpf-cni
// creates. Unlike the alias, which the kernel takes only after the link
// exists (IFLA_IFALIAS is ignored by RTM_NEWLINK's create), the group is
// set by the message that creates the pair: no kill point leaves a pair of
// ours that cannot be recognised. 0xeb9f: "eBPF", out of the way of the
// small numbers administrators give groups.
const Group uint32 = 0xeb9f

// ErrInterfaceExists means the container interface name is taken in the
// pod's netns, or the host veth name is already on the node.
var ErrInterfaceExists = errors.New("interface already exists")

// HostName is the deterministic host-side name of an attachment's veth:
// "ec" + 12 hex digits of sha256(containerID, ifname), 14 characters.
func HostName(containerID, ifName string) string {
	sum := sha256.Sum256([]byte(containerID + "\x00" + ifName))
	return HostPrefix + hex.EncodeToString(sum[:])[:12]
}

// Alias is the ifalias ebpf-cni gives a host veth: the attachment and its
// network, "ebpf-cni:<container ID>/<ifname> <network>" (an interface name
// has no blank), so a record lost with the stateDir can be rebuilt from
// the kernel alone.
func Alias(containerID, ifName, network string) string {
	a := aliasPrefix + containerID + "/" + ifName
	if network != "" && !strings.ContainsAny(network, " \t\n") {
		a += " " + network
	}
	if len(a) > 255 { // IFALIASZ - 1
		a = a[:255]
	}
	return a
}

// IsOurs reports whether a host link was created by ebpf-cni: a veth
// named like ours (HostName's shape) that carries our group or our alias
// (builds before the group set only the alias).
func IsOurs(l netlink.Link) bool {
	a := l.Attrs()
	if !ourName(a.Name) {
		return false
	}
	return a.Group == Group || strings.HasPrefix(a.Alias, aliasPrefix)
}

// Marked reports whether l carries ebpf-cni's alias mark: every device
// ebpf-cni makes does, its host veths (Alias) and the cluster's VXLAN
// device ("ebpf-cni:overlay"). What is marked is never the node's own.
func Marked(l netlink.Link) bool { return strings.HasPrefix(l.Attrs().Alias, aliasPrefix) }

// ourName reports whether name has HostName's shape: the prefix and 12
// lowercase hex digits.
func ourName(name string) bool {
	if len(name) != len(HostPrefix)+12 || !strings.HasPrefix(name, HostPrefix) {
		return false
	}
	for _, c := range name[len(HostPrefix):] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// Owned is whose a host veth is, as its alias says.
type Owned struct {
	ContainerID, IfName string
	// Network is empty when the alias does not name it (builds before
	// it did, or a name cut at IFALIASZ).
	Network string
}

// Owner is the attachment a host veth's alias names; ok is false when the
// alias is missing (a call killed between creating the pair and naming
// it) or not ours.
func Owner(l netlink.Link) (o Owned, ok bool) {
	rest, found := strings.CutPrefix(l.Attrs().Alias, aliasPrefix)
	if !found {
		return o, false
	}
	att, network, _ := strings.Cut(rest, " ")
	i := strings.LastIndexByte(att, '/')
	if i <= 0 || i == len(att)-1 || HostName(att[:i], att[i+1:]) != l.Attrs().Name {
		return o, false // not ours, or cut at IFALIASZ
	}
	if len(l.Attrs().Alias) == 255 {
		network = "" // maybe cut
	}
	return Owned{ContainerID: att[:i], IfName: att[i+1:], Network: network}, true
}

// SetAlias names the attachment on a host veth that lacks its alias.
func SetAlias(l netlink.Link, containerID, ifName, network string) error {
	if err := rtnl.H().LinkSetAlias(l, Alias(containerID, ifName, network)); err != nil {
		return fmt.Errorf("setting alias of %s: %w", l.Attrs().Name, err)
	}
	return nil
}

// Create creates the pair from the host netns, with the peer born
// directly inside podNS as ifName (no rename or move, so nothing is ever
// left half-made in the wrong namespace), and returns the host end. A name
// taken on either side is ErrInterfaceExists: the kernel refuses the pair,
// so nobody looks first.
//
// kind is the pair's device type: KindVeth, or KindNetkit (a netkit pair
// in L3 mode: no MAC, no ARP; the host end is netkit's primary device,
// mac must be nil).
func Create(kind Kind, hostName string, podNS ns.NetNS, ifName string, mtu int, mac net.HardwareAddr, alias string) (netlink.Link, error) {
	attrs := netlink.NewLinkAttrs()
	attrs.Name = hostName
	attrs.MTU = mtu
	attrs.Group = Group
	var v netlink.Link
	switch kind {
	case KindNetkit:
		if mac != nil {
			return nil, fmt.Errorf("a netkit pod has no MAC address (%s asked)", mac)
		}
		nk := &netlink.Netkit{LinkAttrs: attrs, Mode: netlink.NETKIT_MODE_L3, Policy: netlink.NETKIT_POLICY_FORWARD,
			PeerPolicy: netlink.NETKIT_POLICY_FORWARD, Scrub: netlink.NETKIT_SCRUB_DEFAULT, PeerScrub: netlink.NETKIT_SCRUB_DEFAULT}
		peer := netlink.NewLinkAttrs()
		peer.Name = ifName
		peer.MTU = mtu
		peer.Namespace = netlink.NsFd(int(podNS.Fd()))
		nk.SetPeerAttrs(&peer)
		v = nk
	default:
		v = &netlink.Veth{
			LinkAttrs:        attrs,
			PeerName:         ifName,
			PeerHardwareAddr: mac,
			PeerNamespace:    netlink.NsFd(int(podNS.Fd())),
			PeerMTU:          uint32(mtu),
		}
	}
	if err := rtnl.H().LinkAdd(v); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("%s in %s, or host %s %s: %w", ifName, podNS.Path(), kind, hostName, ErrInterfaceExists)
		}
		return nil, fmt.Errorf("creating %s pair %s/%s: %w", kind, hostName, ifName, err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = rtnl.H().LinkDel(v)
		}
	}()
	if err := rtnl.H().LinkSetAlias(v, alias); err != nil {
		return nil, fmt.Errorf("setting alias of %s: %w", hostName, err)
	}
	host, err := rtnl.H().LinkByName(hostName)
	if err != nil {
		return nil, fmt.Errorf("looking up %s: %w", hostName, err)
	}
	ok = true
	return host, nil
}

// Kind is the device type of a pod's pair.
type Kind string

const (
	// KindVeth is a veth pair: the host end's tc hooks run the programs.
	KindVeth Kind = "veth"
	// KindNetkit is a netkit pair in L3 mode (kernel >= 6.7): its own
	// programs run in its transmit, through netkit links.
	KindNetkit Kind = "netkit"
)

// NoMAC is the MAC of a netkit pair's ends in L3 mode as ebpf-cni's
// records and maps hold it: they have none (the kernel reports zeros, or
// no address).
const NoMAC = "00:00:00:00:00:00"

// MAC is the MAC of l, either end of a pair, as the records hold it.
func MAC(l netlink.Link) string {
	if a := l.Attrs().HardwareAddr; len(a) > 0 || l.Type() != string(KindNetkit) {
		return a.String()
	}
	return NoMAC
}

// KindOf is the device type of a host end l.
func KindOf(l netlink.Link) Kind {
	if l != nil && l.Type() == "netkit" {
		return KindNetkit
	}
	return KindVeth
}

// DeleteHost removes the host end (and with it the pair, its routes and
// tc filters). A missing link is not an error; a link that is not ours is
// left alone.
func DeleteHost(name string) error {
	l, err := rtnl.H().LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("looking up %s: %w", name, err)
	}
	if !IsOurs(l) {
		return fmt.Errorf("refusing to delete %s: not created by ebpf-cni (alias %q)", name, l.Attrs().Alias)
	}
	if err := rtnl.H().LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

// Exists reports whether a host veth of ours named name is on the node.
func Exists(name string) bool {
	l, err := rtnl.H().LinkByName(name)
	return err == nil && IsOurs(l)
}

// HostLinks lists the host veths ebpf-cni created in the current netns.
func HostLinks() ([]netlink.Link, error) {
	all, err := rtnl.H().LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	var out []netlink.Link
	for _, l := range all {
		if IsOurs(l) {
			out = append(out, l)
		}
	}
	return out, nil
}

// PeerMAC is the MAC of the host veth l's peer in the pod, asked of the
// kernel across namespaces (IFLA_TARGET_NETNSID): a record rebuilt
// without the endpoint maps learns the pod's MAC without a path to its
// netns. Empty when the kernel does not tell.
func PeerMAC(l netlink.Link) string {
	a := l.Attrs()
	if a.ParentIndex == 0 || a.NetNsID < 0 {
		return ""
	}
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(a.ParentIndex)
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFLA_TARGET_NETNSID, nl.Uint32Attr(uint32(a.NetNsID))))
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
	if err != nil || len(msgs) != 1 {
		return ""
	}
	peer, err := netlink.LinkDeserialize(nil, msgs[0])
	if err != nil {
		return ""
	}
	if peer.Attrs().HardwareAddr == nil && peer.Type() != string(KindNetkit) {
		return ""
	}
	return MAC(peer)
}

// Candidates lists the devices of the current thread's network namespace
// named like our host veths (HostName's shape), from
// /proc/thread-self/net/dev: a quarter of what a link dump costs the
// kernel (0.28 against 1.2 ms with 200 links), for STATUS, which runs
// every 5 s. The name alone does not prove a device ours: IsOurs does,
// for a name the caller has no record of.
func Candidates() ([]string, error) {
	b, err := os.ReadFile("/proc/thread-self/net/dev")
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		name, _, ok := strings.Cut(line, ":")
		if name = strings.TrimSpace(name); ok && ourName(name) {
			out = append(out, name)
		}
	}
	return out, nil
}
