package cli

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/repair"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

func init() {
	register(&Command{
		Name:    "gc",
		Summary: "remove the state of endpoints whose pod is gone (--dry-run lists it)",
		Help: `Removes what the plugin keeps for an endpoint whose pod is gone without a
DEL: its map entries, pinned links, per-device counters and record, as DEL
does, and its ebpf-ipam addresses (only those the attachment still holds,
when ebpf-ipam keeps its state under --state-dir). Then the pinned links and
map entries no remaining endpoint accounts for.

An endpoint is gone when its host veth is no longer in this network
namespace and, if its pod's netns still exists, the pod's interface is gone
too (a veth pair dies whole). An endpoint whose veth exists is never
collected, nor one whose pod interface or tcx link is still alive (then gc
runs in the wrong netns: it says so), nor, outside the node's netns, one
without a record attached with tc (it has no link to follow). It holds the node lock exclusively,
as the plugin's GC does, so no ADD or DEL is half-way.

Addresses ebpf-ipam holds for an attachment with no endpoint (a runtime
that never called DEL, or the pod of another interface plugin) are released
when the network namespace their ADD was given is gone, or, with
--live-containers, when their container is not among those named; the
others are kept, and listed.

--dry-run lists what would be removed and changes nothing.

JSON: {"dryRun", "endpoints": [{"containerID", "ifname", "network",
"hostVeth", "hostIfindex", "reason", "ips", "ipamReleased", "error"}],
"ipamLeaks": [{"network", "containerID", "ifname", "netns", "ips", "gone",
"released", "error"}], "leftovers": [], "skipped": [], "notes": []}. Exit
status 1 if anything could not be removed.`,
		Flags: func(fs *flag.FlagSet) func(*Context) error {
			dry := fs.Bool("dry-run", false, "list what would be removed, remove nothing")
			live := fs.String("live-containers", "", "the container `IDS` alive on the node (comma or space separated, e.g. $(crictl pods -q)): ebpf-ipam addresses held for any other container without an endpoint are released")
			return func(ctx *Context) error {
				given := false
				fs.Visit(func(f *flag.Flag) { given = given || f.Name == "live-containers" })
				return runGC(ctx, *dry, parseLive(*live, given))
			}
		},
	})
}

// Collected is one endpoint gc removes.
type Collected struct {
	ContainerID  string   `json:"containerID"`
	IfName       string   `json:"ifname"`
	Network      string   `json:"network"`
	HostVeth     string   `json:"hostVeth"`
	HostIfIndex  int      `json:"hostIfindex"`
	Reason       string   `json:"reason"`
	IPs          []string `json:"ips"`
	IPAMReleased []string `json:"ipamReleased"`
	Error        string   `json:"error,omitempty"`
}

type gcOutput struct {
	DryRun    bool         `json:"dryRun"`
	Endpoints []*Collected `json:"endpoints"`
	IPAMLeaks []*IPAMLeak  `json:"ipamLeaks"`
	Leftovers []string     `json:"leftovers"`
	Skipped   []string     `json:"skipped"`
	Notes     []string     `json:"notes"`
}

func runGC(ctx *Context, dryRun bool, live map[string]bool) error {
	if err := ctx.CheckRoot(); err != nil {
		return err
	}
	mode := node.Exclusive
	if dryRun {
		mode = node.Unlocked
	}
	nd, err := node.Open(node.Options{BPFRoot: ctx.BPFRoot, StateDir: ctx.StateDir, Objects: features.Objects(), Tag: features.Tag(), Lock: mode})
	if err != nil {
		return fmt.Errorf("taking the node lock (--state-dir): %w", err)
	}
	defer nd.Close()
	g := &gcRun{ctx: ctx, nd: nd, dryRun: dryRun, kept: map[string]*node.Record{},
		out: &gcOutput{DryRun: dryRun, Endpoints: []*Collected{}, IPAMLeaks: []*IPAMLeak{}, Leftovers: []string{}, Skipped: []string{}, Notes: []string{}}}
	orphaned := g.orphans()
	n, err := loadNode(ctx)
	if err != nil {
		return err
	}
	// In the node's netns a host veth attached with tc that is not found
	// is gone; elsewhere it cannot be told from a live one (no link to
	// follow from here).
	g.nodeNetNS, _ = nd.InNodeNetns()
	for _, e := range n.Endpoints {
		if orphaned[e.HostIfIndex] && !e.Recorded {
			continue // listed already (a dry run leaves it)
		}
		g.endpoint(e)
	}
	g.failed = append(g.failed, gcIPAMLeaks(ctx, n, live, g.out)...)
	// Map entries with no record at all, while the maps hold endpoints,
	// most likely mean --state-dir is not the plugin's: sweeping would cut
	// live pods off.
	if _, err := os.Stat(nd.StatePath("endpoints")); errors.Is(err, os.ErrNotExist) && len(n.Endpoints) > 0 {
		g.out.Notes = append(g.out.Notes, fmt.Sprintf("no endpoint records under %s: left the map entries alone; is --state-dir the plugin's stateDir?", ctx.StateDir))
	} else if nd.HasMap(maps.CniMapEndpoints) && nd.HasMap(maps.CniMapEndpointDevs) {
		left, err := repair.Leftovers(nd, g.kept, dryRun)
		g.out.Leftovers = append(g.out.Leftovers, left...)
		if err != nil {
			g.failed = append(g.failed, err)
		}
	}
	if ctx.JSON {
		if err := writeJSON(ctx.Stdout, g.out); err != nil {
			return err
		}
	} else if err := printGC(ctx, g.out); err != nil {
		return err
	}
	if len(g.failed) > 0 {
		return fmt.Errorf("some state could not be removed: %w", errors.Join(g.failed...))
	}
	return nil
}

// gcRun is one gc: the node, what it keeps, what it found and did.
type gcRun struct {
	ctx       *Context
	nd        *node.Node
	dryRun    bool
	nodeNetNS bool                    // this is the node's netns
	kept      map[string]*node.Record // by host veth
	out       *gcOutput
	failed    []error
}

// orphans collects the endpoints with neither a record nor a host veth
// (gone without DEL while the stateDir was lost), as the plugin's STATUS
// does, and returns their host ifindexes.
func (g *gcRun) orphans() map[int]bool {
	orphans, problem, err := repair.ReclaimOrphans(g.nd, nil, nil, g.dryRun)
	if err != nil {
		g.failed = append(g.failed, err)
	}
	if problem != "" {
		g.out.Notes = append(g.out.Notes, problem)
	}
	orphaned := map[int]bool{}
	for _, or := range orphans {
		orphaned[or.IfIndex] = true
		c := &Collected{ContainerID: or.ContainerID, IfName: or.IfName, Network: or.Network, HostVeth: veth.HostName(or.ContainerID, or.IfName),
			HostIfIndex: or.IfIndex, Reason: "host veth gone, no record", IPs: []string{}, IPAMReleased: []string{}}
		for _, ip := range or.IPs {
			c.IPs = append(c.IPs, ip.String())
		}
		for _, ip := range or.Released {
			c.IPAMReleased = append(c.IPAMReleased, ip.String())
		}
		g.out.Endpoints = append(g.out.Endpoints, c)
	}
	return orphaned
}

// endpoint keeps e, or collects it when its pod is gone: its state, as
// DEL removes it, and its ebpf-ipam addresses.
func (g *gcRun) endpoint(e *Endpoint) {
	if e.rec == nil {
		g.unrecorded(e)
		return
	}
	dead, why := gone(e)
	if !dead {
		g.kept[e.rec.HostIfName] = e.rec
		if why != "" {
			g.out.Skipped = append(g.out.Skipped, fmt.Sprintf("%s (%s): %s", e.Name(), e.HostVeth, why))
		}
		return
	}
	c := &Collected{ContainerID: e.ContainerID, IfName: e.IfName, Network: e.Network, HostVeth: e.HostVeth,
		HostIfIndex: e.HostIfIndex, Reason: why, IPs: e.IPs, IPAMReleased: []string{}}
	g.out.Endpoints = append(g.out.Endpoints, c)
	if !g.dryRun {
		if err := repair.Teardown(g.nd, e.rec.HostIfName); err != nil {
			c.Error = err.Error()
			g.failed = append(g.failed, err)
			return // its record stays, so the addresses stay accounted for
		}
	}
	released, note, err := releaseIPAM(g.ctx, g.nd, e.rec, g.dryRun)
	c.IPAMReleased = append(c.IPAMReleased, released...)
	if note != "" {
		g.out.Notes = append(g.out.Notes, fmt.Sprintf("%s: %s", e.Name(), note))
	}
	if err != nil {
		c.Error = err.Error()
		g.failed = append(g.failed, err)
	}
}

// unrecorded keeps an endpoint without a record (a crash between the map
// entry and the record) while its veth lives, here or, seen through its
// tcx link, in another netns: DEL or the CNI GC of its network removes a
// live one; otherwise its entries are leftovers.
func (g *gcRun) unrecorded(e *Endpoint) {
	host := veth.HostName(e.ContainerID, e.IfName)
	if e.clsact && !e.VethPresent && !g.nodeNetNS {
		g.kept[host] = &node.Record{HostIfName: host, HostIfIndex: e.HostIfIndex}
		g.out.Skipped = append(g.out.Skipped, fmt.Sprintf("%s (%s): no record, attached with tc (no link to follow from this network namespace): run ebpf-cni in the node's network namespace", e.Name(), host))
		return
	}
	guess := &node.Record{HostIfName: host, HostIfIndex: e.HostIfIndex}
	for _, ip := range e.IPs {
		// Its addresses keep its flows and published ports.
		if a := net.ParseIP(ip); a != nil && a.To4() != nil {
			guess.IPs = append(guess.IPs, ip+"/32")
		} else if a != nil {
			guess.IPs = append(guess.IPs, ip+"/128")
		}
	}
	for _, h := range append(endpointHooks(nil), netkitHooks()...) {
		mode := attach.ModeTCX
		if h.Netkit != 0 {
			mode = attach.ModeNetkit
		}
		guess.Attachments = append(guess.Attachments, attach.Attachment{Hook: h.Name, Mode: mode,
			Pin: filepath.Join(g.nd.LinkDir(host), h.Name)})
	}
	if dead, _ := gone(&Endpoint{VethPresent: e.VethPresent, rec: guess}); !dead {
		g.kept[host] = guess
	}
}

// gone says whether an endpoint's pod is gone, and why; or, when its veth
// is merely not in this netns, why it is kept.
func gone(e *Endpoint) (bool, string) {
	if e.VethPresent {
		return false, ""
	}
	// A tcx or netkit link knows its device from any netns; its ifindex
	// turns 0 when the device is deleted.
	for _, a := range e.rec.Attachments {
		if (a.Mode != attach.ModeTCX && a.Mode != attach.ModeNetkit) || a.Pin == "" {
			continue
		}
		if i := attach.LinkIfindex(a.Pin); i != 0 {
			return false, fmt.Sprintf("host veth not in this network namespace, but its %s link %s is attached to ifindex %d: run ebpf-cni in the node's network namespace", a.Mode, a.Pin, i)
		}
	}
	if e.NetNS == "" {
		return true, "host veth gone"
	}
	if !node.IsNetNS(e.NetNS) {
		return true, fmt.Sprintf("netns %s gone", e.NetNS)
	}
	alive := false
	_ = ns.WithNetNSPath(e.NetNS, func(ns.NetNS) error {
		l, err := netlinksafe.LinkByName(e.IfName)
		alive = err == nil && attach.PodDevice(l) && strings.EqualFold(veth.MAC(l), e.MAC)
		return nil
	})
	if alive {
		return false, fmt.Sprintf("host veth not in this network namespace, but the pod's %s is alive in %s: run ebpf-cni in the node's network namespace", e.IfName, e.NetNS)
	}
	return true, "host veth gone"
}

// releaseIPAM releases what ebpf-ipam holds for the record's attachment, if
// ebpf-ipam keeps the network's state under stateDir. Only addresses the
// attachment still holds in the map are released, so an address already
// handed to a live pod is never touched.
func releaseIPAM(ctx *Context, nd *node.Node, rec *node.Record, dryRun bool) (released []string, note string, err error) {
	netName := rec.Network
	if netName == "" || netName == "." || netName == ".." || strings.ContainsAny(netName, "/\\") {
		return nil, "", nil
	}
	if _, err := os.Stat(nd.StatePath("ipam", netName, "owners")); err != nil {
		return nil, fmt.Sprintf("no ebpf-ipam state for network %s under %s: if it uses another IPAM plugin, the CNI GC of the network releases its addresses", netName, ctx.StateDir), nil
	}
	if dryRun {
		// Opening the store takes its lock and may write: list what the
		// record says instead.
		return rec.IPs, "", nil
	}
	// The network's bookkeeping goes with its last address, as on DEL.
	ips, err := repair.ReleaseEbpfIPAM(nd, netName, rec.ContainerID, rec.IfName)
	for _, ip := range ips {
		released = append(released, ip.String())
	}
	return released, "", err
}

func printGC(ctx *Context, out *gcOutput) error {
	w := ctx.Stdout
	verb := "removed"
	if out.DryRun {
		verb = "would remove (dry run)"
	}
	if len(out.Endpoints) == 0 {
		fmt.Fprintf(w, "no endpoint to collect: every recorded pod is alive\n")
	} else {
		fmt.Fprintf(w, "%s %d endpoint(s):\n", verb, len(out.Endpoints))
		t := &view.Table{Header: []string{"CONTAINER/IFNAME", "HOST VETH", "NETWORK", "REASON", "IPS", "IPAM RELEASED", "ERROR"}}
		for _, c := range out.Endpoints {
			t.Row((&Endpoint{ContainerID: c.ContainerID, IfName: c.IfName}).Name(), orDash(c.HostVeth), orDash(c.Network), c.Reason,
				orDash(strings.Join(c.IPs, ",")), orDash(strings.Join(c.IPAMReleased, ",")), c.Error)
		}
		if err := t.Write(w); err != nil {
			return err
		}
	}
	for _, s := range []struct {
		title string
		lines []string
	}{{verb + " leftovers (no endpoint accounts for them)", out.Leftovers}, {verb + " ebpf-ipam addresses of gone containers", leakLines(out.IPAMLeaks)},
		{"kept", out.Skipped}, {"notes", out.Notes}} {
		if len(s.lines) > 0 {
			fmt.Fprintf(w, "\n%s:\n  %s\n", s.title, strings.Join(s.lines, "\n  "))
		}
	}
	return nil
}
