// Package attach puts programs where they run and takes them off again:
// tcx links and legacy tc (clsact + cls_bpf) filters on devices, netkit
// links on a netkit pair's host end, links on cgroups. It knows no feature: a Hook says where a program goes, an
// Attachment records where it went, so DEL, CHECK and upgrades find it
// again.
package attach

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/kernel"
	"github.com/ebpf-cni/ebpf-cni/pkg/rtnl"
)

// Mode is how programs are attached to a device.
type Mode string

const (
	// ModeAuto uses tcx where the kernel has it, else tc.
	ModeAuto Mode = "auto"
	// ModeTCX attaches with a tcx link (kernel >= 6.6), pinned under bpfRoot.
	ModeTCX Mode = "tcx"
	// ModeTC attaches a cls_bpf direct-action filter under a clsact qdisc.
	ModeTC Mode = "tc"
	// ModeCgroup is a cgroup link, pinned under bpfRoot (recorded, never
	// configured: a cgroup hook has no other way to attach).
	ModeCgroup Mode = "cgroup"
	// ModeNetkit is a netkit link (kernel >= 6.7), pinned under bpfRoot:
	// the program runs in the netkit device's own transmit (recorded,
	// never configured: a netkit hook has no other way to attach).
	ModeNetkit Mode = "netkit"
)

// DefaultMode is how a host veth's programs attach when the configuration
// names no attachMode: tc. Measured on kernel 6.18 with EBPF_CNI_TIMING: a
// tcx link costs an RCU grace period per attach and per detach, taken
// under RTNL (so every other netlink user of the node waits too): the
// endpoint step of ADD took 22-43 ms with tcx against 0.4-0.9 ms with tc
// filters, and the whole ADD 35-55 ms against 12-15 ms. tcx's links are
// pinned and owned, and it needs no qdisc: a chained plugin that adds its
// own ingress qdisc (the reference bandwidth plugin's egress limit) works
// only next to tcx, so such a chain sets attachMode tcx (or auto), see
// docs/configuration.md.
var DefaultMode = ModeTC

// DefaultDeviceMode is how the node's own devices (uplinks, the overlay)
// get their programs when the configuration names no attachMode: tc too.
// It happens once per node, with its first pod, but then that pod waits
// for it: two tcx links on the uplink took 23-33 ms of the first ADD. An
// existing clsact on the uplink is shared; a configured attachMode (auto,
// tcx) applies to the devices as well.
var DefaultDeviceMode = ModeTC

// DeviceMode is the mode for the node's devices of a configured attachMode
// ("" for none).
func DeviceMode(configured string) Mode {
	if configured == "" {
		return DefaultDeviceMode
	}
	return Mode(configured)
}

// ParseMode validates an attachMode value; "" is the default.
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case "":
		return DefaultMode, nil
	case ModeAuto, ModeTCX, ModeTC:
		return Mode(s), nil
	}
	return "", fmt.Errorf("unknown attach mode %q (want auto, tcx or tc)", s)
}

// Target is the kind of place a hook's program runs at.
type Target string

const (
	// Endpoint: the host end of every veth pod's pair (pkg/endpoint
	// attaches).
	Endpoint Target = "endpoint"
	// NetkitEndpoint: a netkit pod's pair, whose peer program runs in the
	// pod's end's transmit (attached through the host end, netkit's
	// primary device); it replaces an Endpoint hook (Hook.Instead).
	NetkitEndpoint Target = "netkit-endpoint"
	// Device: a device of the node a feature picks (an uplink, later an
	// overlay device); the feature attaches and records it.
	Device Target = "device"
	// Cgroup: the node's cgroup (socket hooks).
	Cgroup Target = "cgroup"
)

// Hook is one attach point of one program.
type Hook struct {
	Name      string          // program name, pin name
	Target    Target          // where it runs
	TCXAttach ebpf.AttachType // device hooks: the tcx attach type
	TCParent  uint32          // device hooks: the clsact parent of the legacy filter
	Cgroup    ebpf.AttachType // cgroup hooks: the attach type
	// Netkit is a netkit hook's attach type (AttachNetkitPeer: what the pod
	// sends; AttachNetkitPrimary: what the host end sends to the pod),
	// always given the host end's ifindex; 0 for any other hook.
	Netkit ebpf.AttachType
	// Instead names the Endpoint hook a NetkitEndpoint hook replaces.
	Instead string
}

// linkAttach is the attach type a hook's link (tcx or netkit) has.
func (h Hook) linkAttach() ebpf.AttachType {
	if h.Netkit != 0 {
		return h.Netkit
	}
	return h.TCXAttach
}

// NetkitHook is a hook of a netkit pod's host end that runs instead of
// the Endpoint hook named instead (a veth's).
func NetkitHook(name string, t ebpf.AttachType, instead string) Hook {
	return Hook{Name: name, Target: NetkitEndpoint, Netkit: t, Instead: instead}
}

// EndpointHooksOf picks from hooks those of the pod whose host end is l:
// the Endpoint hooks, on a netkit device each replaced by the
// NetkitEndpoint hook that runs instead of it.
func EndpointHooksOf(hooks []Hook, l netlink.Link) []Hook {
	var out []Hook
	for _, h := range hooks {
		if h.Target != Endpoint {
			continue
		}
		if IsNetkit(l) {
			for _, n := range hooks {
				if n.Target == NetkitEndpoint && n.Instead == h.Name {
					h = n
				}
			}
		}
		out = append(out, h)
	}
	return out
}

// IsNetkit reports whether l is a netkit device.
func IsNetkit(l netlink.Link) bool { return l != nil && l.Type() == "netkit" }

// PodDevice reports whether l, found in a pod's netns, can be the pod's
// end of one of our pairs (a veth, or a netkit pair's peer).
func PodDevice(l netlink.Link) bool { return l.Type() == "veth" || l.Type() == "netkit" }

// LinkIfindex is the ifindex the pinned tcx or netkit link at pin is
// attached to: 0 when its device is gone (or pin is no such link).
func LinkIfindex(pin string) int {
	lk, err := link.LoadPinnedLink(pin, nil)
	if err != nil {
		return 0
	}
	defer lk.Close()
	info, err := lk.Info()
	if err != nil {
		return 0
	}
	if t := info.TCX(); t != nil {
		return int(t.Ifindex)
	}
	if nk := info.Netkit(); nk != nil {
		return int(nk.Ifindex)
	}
	return 0
}

// Find is the hook of hooks named name; a hook of that name alone when
// none is (detaching needs only what the attachment recorded).
func Find(hooks []Hook, name string) Hook {
	for _, h := range hooks {
		if h.Name == name {
			return h
		}
	}
	return Hook{Name: name}
}

// Ingress is a device hook on the device's ingress.
func Ingress(name string, t Target) Hook {
	return Hook{Name: name, Target: t, TCXAttach: ebpf.AttachTCXIngress, TCParent: netlink.HANDLE_MIN_INGRESS}
}

// Egress is a device hook on the device's egress.
func Egress(name string, t Target) Hook {
	return Hook{Name: name, Target: t, TCXAttach: ebpf.AttachTCXEgress, TCParent: netlink.HANDLE_MIN_EGRESS}
}

// CgroupHook is a hook of the node's cgroup.
func CgroupHook(name string, t ebpf.AttachType) Hook {
	return Hook{Name: name, Target: Cgroup, Cgroup: t}
}

// Attachment records one attached program.
type Attachment struct {
	Hook string `json:"hook"`
	Mode Mode   `json:"mode"`
	// Pin is the link's pin (ModeTCX, ModeNetkit, ModeCgroup); its file name is the
	// hook's name, so pinned links can be found without their record.
	Pin string `json:"pin,omitempty"`
	// Priority and Handle locate the cls_bpf filter (ModeTC); a tc filter
	// cannot be pinned, and it goes away with the device.
	Priority uint16 `json:"priority,omitempty"`
	Handle   uint32 `json:"handle,omitempty"`
}

const (
	tcPriority = 1
	tcHandle   = 1
)

// Attach attaches prog at hook on l; a tcx link is pinned in pinDir.
// ModeAuto resolves to tcx, falling back to tc on kernels without it.
// A netkit hook attaches with a netkit link whatever the mode.
func Attach(mode Mode, l netlink.Link, hook Hook, prog *ebpf.Program, pinDir string) (Attachment, error) {
	if hook.Netkit != 0 {
		return attachNetkit(l, hook, prog, pinDir)
	}
	switch mode {
	case ModeTCX:
		return attachTCX(l, hook, prog, pinDir)
	case ModeTC:
		return attachTC(l, hook, prog)
	case ModeAuto:
		a, err := attachTCX(l, hook, prog, pinDir)
		if errors.Is(err, ebpf.ErrNotSupported) {
			return attachTC(l, hook, prog)
		}
		return a, err
	}
	return Attachment{}, fmt.Errorf("unknown attach mode %q", mode)
}

func attachTCX(l netlink.Link, hook Hook, prog *ebpf.Program, dir string) (Attachment, error) {
	return attachLink(l, hook, dir, ModeTCX, func() (link.Link, error) {
		return link.AttachTCX(link.TCXOptions{Interface: l.Attrs().Index, Program: prog, Attach: hook.TCXAttach})
	})
}

func attachNetkit(l netlink.Link, hook Hook, prog *ebpf.Program, dir string) (Attachment, error) {
	return attachLink(l, hook, dir, ModeNetkit, func() (link.Link, error) {
		return link.AttachNetkit(link.NetkitOptions{Interface: l.Attrs().Index, Program: prog, Attach: hook.Netkit})
	})
}

// attachLink makes a device's link of mode (tcx, netkit) with mk and pins
// it in dir, named as the hook.
func attachLink(l netlink.Link, hook Hook, dir string, mode Mode, mk func() (link.Link, error)) (Attachment, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Attachment{}, fmt.Errorf("creating %s: %w", dir, err)
	}
	pin := filepath.Join(dir, hook.Name)
	lk, err := mk()
	if err != nil {
		return Attachment{}, fmt.Errorf("attaching %s to %s with a %s link: %w", hook.Name, l.Attrs().Name, mode, err)
	}
	defer lk.Close()
	if err := lk.Pin(pin); err != nil {
		return Attachment{}, fmt.Errorf("pinning %s link %s: %w", mode, pin, err)
	}
	return Attachment{Hook: hook.Name, Mode: mode, Pin: pin}, nil
}

func clsact(ifindex int) *netlink.GenericQdisc {
	return &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
}

func tcFilter(ifindex int, hook Hook, prog *ebpf.Program) *netlink.BpfFilter {
	return &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: ifindex,
			Parent:    hook.TCParent,
			Handle:    tcHandle,
			Priority:  tcPriority,
			Protocol:  unix.ETH_P_ALL,
		},
		Fd:           prog.FD(),
		Name:         hook.Name,
		DirectAction: true,
	}
}

func attachTC(l netlink.Link, hook Hook, prog *ebpf.Program) (Attachment, error) {
	idx := l.Attrs().Index
	if err := rtnl.H().QdiscAdd(clsact(idx)); err != nil && !errors.Is(err, unix.EEXIST) {
		return Attachment{}, fmt.Errorf("adding clsact qdisc to %s: %w", l.Attrs().Name, err)
	}
	f := tcFilter(idx, hook, prog)
	err := rtnl.H().FilterAdd(f)
	if errors.Is(err, unix.EEXIST) && ownFilter(l, hook) {
		// Ours, left by a node that lost its records (a wiped stateDir,
		// a remounted bpffs): the device outlived them. Replaced in place.
		err = rtnl.H().FilterReplace(f)
	}
	if err != nil {
		return Attachment{}, fmt.Errorf("adding tc filter %s to %s: %w", hook.Name, l.Attrs().Name, err)
	}
	return Attachment{Hook: hook.Name, Mode: ModeTC, Priority: tcPriority, Handle: tcHandle}, nil
}

// ownFilter reports whether l's filter at our priority and handle on
// hook's parent is a BPF filter of ours (named as the hook's program): the
// one another tool put there is never replaced.
func ownFilter(l netlink.Link, hook Hook) bool {
	filters, err := rtnl.H().FilterList(l, hook.TCParent)
	if err != nil {
		return false
	}
	for _, f := range filters {
		bf, ok := f.(*netlink.BpfFilter)
		if ok && bf.Priority == tcPriority && bf.Handle == tcHandle && strings.HasPrefix(bf.Name, hook.Name) {
			return true
		}
	}
	return false
}

// AttachCgroup attaches prog at hook to the cgroup v2 directory cgroup and
// pins the link in pinDir.
func AttachCgroup(cgroup string, hook Hook, prog *ebpf.Program, pinDir string) (Attachment, error) {
	if err := os.MkdirAll(pinDir, 0o700); err != nil {
		return Attachment{}, fmt.Errorf("creating %s: %w", pinDir, err)
	}
	pin := filepath.Join(pinDir, hook.Name)
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroup, Attach: hook.Cgroup, Program: prog})
	if err != nil {
		return Attachment{}, fmt.Errorf("attaching %s to cgroup %s: %w", hook.Name, cgroup, err)
	}
	defer l.Close()
	if err := l.Pin(pin); err != nil {
		_ = l.Unpin()
		return Attachment{}, fmt.Errorf("pinning %s: %w", pin, err)
	}
	return Attachment{Hook: hook.Name, Mode: ModeCgroup, Pin: pin}, nil
}

// Replace swaps the program of an attachment atomically: link update or tc
// filter replace; the device or cgroup never runs without a program.
func Replace(a Attachment, ifindex int, hook Hook, prog *ebpf.Program) error {
	switch a.Mode {
	case ModeTCX, ModeNetkit, ModeCgroup:
		return UpdatePinned(a.Pin, prog)
	case ModeTC:
		if err := rtnl.H().FilterReplace(tcFilter(ifindex, hook, prog)); err != nil {
			return fmt.Errorf("replacing tc filter %s on ifindex %d: %w", a.Hook, ifindex, err)
		}
		return nil
	}
	return fmt.Errorf("unknown attach mode %q", a.Mode)
}

// UpdatePinned points the pinned link at pin to prog.
func UpdatePinned(pin string, prog *ebpf.Program) error {
	lk, err := link.LoadPinnedLink(pin, nil)
	if err != nil {
		return fmt.Errorf("loading pinned link %s: %w", pin, err)
	}
	defer lk.Close()
	if err := lk.Update(prog); err != nil {
		return fmt.Errorf("updating link %s: %w", pin, err)
	}
	return nil
}

// Detach removes an attachment. Removing the pin of a tcx link releases it
// (the device lets go of the program); a tc filter is deleted if its device
// is still there; a cgroup link is detached at once (the cgroup stays).
// Idempotent.
func Detach(a Attachment, ifindex int, hook Hook) error {
	return detach(a, ifindex, hook, a.Mode == ModeCgroup)
}

// DetachNow is Detach that also takes a tcx program off its device before
// returning. Unpinning alone leaves the link to a deferred release, which is
// fine for a host veth about to be deleted, not for a device that stays.
func DetachNow(a Attachment, ifindex int, hook Hook) error {
	return detach(a, ifindex, hook, true)
}

func detach(a Attachment, ifindex int, hook Hook, now bool) error {
	switch a.Mode {
	case ModeTCX, ModeNetkit, ModeCgroup:
		return unpin(a.Pin, now)
	case ModeTC:
		l, err := rtnl.H().LinkByIndex(ifindex)
		if err != nil {
			return nil // the device took its filters with it
		}
		f := &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index, Parent: hook.TCParent, Handle: a.Handle, Priority: a.Priority, Protocol: unix.ETH_P_ALL}}
		if err := rtnl.H().FilterDel(f); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("deleting tc filter %s on %s: %w", a.Hook, l.Attrs().Name, err)
		}
		return nil
	}
	return nil
}

// unpin removes a pinned link, detaching it first when now (an unpinned
// link lingers while a handle is open somewhere).
func unpin(pin string, now bool) error {
	if now {
		if lk, err := link.LoadPinnedLink(pin, nil); err == nil {
			err = lk.Detach()
			lk.Close()
			if err != nil && !errors.Is(err, unix.ENOLINK) && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("detaching %s: %w", pin, err)
			}
		} else if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("opening %s: %w", pin, err)
		}
	}
	if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unpinning %s: %w", pin, err)
	}
	return nil
}

// DetachPinned detaches and unpins the links of hooks pinned in pinDir,
// recorded or not (their pins are named by hook), and removes pinDir
// when it is empty. Idempotent.
func DetachPinned(pinDir string, hooks []Hook) error {
	var errs []error
	for _, h := range hooks {
		errs = append(errs, unpin(filepath.Join(pinDir, h.Name), true))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// Another set of hooks may still be pinned there.
	if err := os.Remove(pinDir); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENOTEMPTY) {
		return err
	}
	return nil
}

// PinnedProgram is the kernel ID of the program the link pinned at pin
// runs; an error when there is no such link.
func PinnedProgram(pin string) (ebpf.ProgramID, error) {
	l, err := link.LoadPinnedLink(pin, nil)
	if err != nil {
		return 0, err
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return 0, err
	}
	return info.Program, nil
}

// AttachedIDs lists the programs attached at hook on the device, in both
// tcx and tc, so CHECK sees exactly what runs.
// HooksAttached reports whether every one of hooks runs the program of ids
// (a program set's IDs: id -> hook name) on l (tcx or tc).
func HooksAttached(l netlink.Link, hooks []Hook, ids map[ebpf.ProgramID]string) bool {
	for _, h := range hooks {
		got, err := AttachedIDs(l, h)
		if err != nil {
			return false
		}
		found := false
		for _, id := range got {
			found = found || ids[id] == h.Name
		}
		if !found {
			return false
		}
	}
	return true
}

// AttachedIDs lists the programs on l's hook.
func AttachedIDs(l netlink.Link, hook Hook) ([]ebpf.ProgramID, error) {
	var ids []ebpf.ProgramID
	if hook.Netkit != 0 {
		res, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: hook.Netkit})
		if err != nil {
			return nil, fmt.Errorf("querying netkit programs of %s: %w", l.Attrs().Name, err)
		}
		for _, p := range res.Programs {
			ids = append(ids, p.ID)
		}
		return ids, nil
	}
	res, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: hook.TCXAttach})
	// A kernel without tcx (before 6.6) refuses the query with EINVAL.
	if err != nil && !errors.Is(err, ebpf.ErrNotSupported) && (!errors.Is(err, unix.EINVAL) || kernel.HaveTCX().Available) {
		return nil, fmt.Errorf("querying tcx programs of %s: %w", l.Attrs().Name, err)
	}
	if res != nil {
		for _, p := range res.Programs {
			ids = append(ids, p.ID)
		}
	}
	filters, err := rtnl.H().FilterList(l, hook.TCParent)
	if err != nil {
		return nil, fmt.Errorf("listing tc filters of %s: %w", l.Attrs().Name, err)
	}
	for _, f := range filters {
		if bf, ok := f.(*netlink.BpfFilter); ok {
			ids = append(ids, ebpf.ProgramID(bf.Id))
		}
	}
	return ids, nil
}

// Observed is the attachment of hook on l as the kernel shows it, for a
// record rebuilt without its file: a tcx link pinned in pinDir, or our tc
// filter on the hook's clsact parent; false when neither is there.
func Observed(l netlink.Link, hook Hook, pinDir string) (Attachment, bool) {
	pin := filepath.Join(pinDir, hook.Name)
	if _, err := os.Stat(pin); err == nil {
		if hook.Netkit != 0 {
			return Attachment{Hook: hook.Name, Mode: ModeNetkit, Pin: pin}, true
		}
		return Attachment{Hook: hook.Name, Mode: ModeTCX, Pin: pin}, true
	}
	if hook.Netkit != 0 {
		return Attachment{}, false
	}
	filters, err := rtnl.H().FilterList(l, hook.TCParent)
	if err != nil {
		return Attachment{}, false
	}
	for _, f := range filters {
		if bf, ok := f.(*netlink.BpfFilter); ok && bf.Priority == tcPriority && bf.Handle == tcHandle {
			return Attachment{Hook: hook.Name, Mode: ModeTC, Priority: tcPriority, Handle: tcHandle}, true
		}
	}
	return Attachment{}, false
}

// DetachStale takes off hook on l the tcx or netkit links that run
// another program than keep: links whose pin was lost (a remounted bpffs)
// and that a repair replaces; nothing else holds them to detach them by.
func DetachStale(l netlink.Link, hook Hook, keep ebpf.ProgramID) error {
	res, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: hook.linkAttach()})
	if err != nil || res == nil {
		return nil // no tcx here
	}
	var errs []error
	for _, p := range res.Programs {
		id, ok := p.LinkID()
		if !ok || p.ID == keep {
			continue
		}
		lk, err := link.NewFromID(id)
		if err != nil {
			continue // released meanwhile
		}
		if err := lk.Detach(); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("detaching stale tcx link %d (program %d) from %s: %w", id, p.ID, l.Attrs().Name, err))
		}
		lk.Close()
	}
	return errors.Join(errs...)
}
