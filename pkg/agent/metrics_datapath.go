package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ebpf-cni/ebpf-cni/pkg/counters"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	nodestate "github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
	"github.com/ebpf-cni/ebpf-cni/pkg/repair"
)

// datapathCollector reads the plugin's pinned maps and records when
// scraped: the counters the programs keep (node-wide and per device, by
// reason and direction), how full each map that can fill is, which
// programs are pinned, how the endpoints are attached, when the node was
// last healed. Maps and files that are not there yet (no pod so far) are
// left out; one that cannot be read counts in ebpf_cni_scrape_errors.
type datapathCollector struct {
	n   *nodestate.Node // the agent's handle on the plugin's node
	log *slog.Logger

	packets, bytes, epPackets, epBytes *prometheus.Desc
	entries, capacity                  *prometheus.Desc
	pinned, current, attached, healed  *prometheus.Desc
	pending                            *prometheus.Desc
	scrapeErrors                       *prometheus.Desc
}

// endpointLabels are the labels of the per-endpoint series: the pod (when
// the runtime passed K8S_POD_* in CNI_ARGS), the attachment, the device.
var endpointLabels = []string{"namespace", "pod", "container_id", "ifname", "device", "reason", "direction"}

func newDatapathCollector(n *nodestate.Node, log *slog.Logger) *datapathCollector {
	c := &datapathCollector{n: n, log: log,
		packets: desc("ebpf_cni_packets_total", prometheus.CounterValue,
			"packets the datapath programs handled on this node, by reason (what they did: redirect, snat, drop_spoof_src...) and direction (egress: leaving a pod, or the node on an uplink; ingress: arriving)", "reason", "direction"),
		bytes: desc("ebpf_cni_bytes_total", prometheus.CounterValue,
			"bytes of those packets", "reason", "direction"),
		epPackets: desc("ebpf_cni_endpoint_packets_total", prometheus.CounterValue,
			"packets per device (a pod's host veth, or an uplink), by reason and direction; only reasons with a non-zero count", endpointLabels...),
		epBytes: desc("ebpf_cni_endpoint_bytes_total", prometheus.CounterValue,
			"bytes per device, by reason and direction; only reasons with a non-zero count", endpointLabels...),
		entries: desc("ebpf_cni_map_entries", prometheus.GaugeValue,
			"entries in a pinned map that pods or traffic can fill (device_slots: the slots devices own)", "map"),
		capacity: desc("ebpf_cni_map_capacity", prometheus.GaugeValue,
			"the most entries the map holds (max_entries); a full hash map refuses new entries, an LRU map (nat, flows, sock_revnat) evicts the least recently used, a device that finds device_slots full counts in device_counters", "map"),
		pinned: desc("ebpf_cni_programs_pinned", prometheus.GaugeValue,
			"1 per program set pinned on the node, labelled with its tag (version and digest); more than one only during an upgrade", "tag"),
		current: desc("ebpf_cni_programs_current", prometheus.GaugeValue,
			"1 when the programs of the agent's build are pinned (the plugin installed with it loaded them), 0 if not"),
		attached: desc("ebpf_cni_endpoint_attachments", prometheus.GaugeValue,
			"programs attached to pods' host ends, by attach mode (tcx, tc or netkit), from the endpoint records", "mode"),
		healed: desc("ebpf_cni_last_heal_timestamp_seconds", prometheus.GaugeValue,
			"when a plugin call (STATUS, ADD, repair) last compared the node's state with the kernel and repaired what it found (unix seconds)"),
		pending: desc("ebpf_cni_repair_pending", prometheus.GaugeValue,
			"what the next plugin repair (a CNI STATUS, an ADD when no STATUS ran for 5 s, ebpf-cni repair) would mend, as a dry run of it finds it now, by kind: rebuild (a live pod's lost record), reclaim (a pod gone without DEL, with or without its record), remove (a pair nobody owns), restore (what a bpffs loss took from a live pod), problem (what it cannot mend); lasting non-zero: no call repairs the node (a runtime that never calls STATUS and starts no pod)", "kind"),
		scrapeErrors: desc("ebpf_cni_scrape_errors", prometheus.GaugeValue,
			"sources (maps, records) this scrape could not read; the agent's log says why"),
	}
	return c
}

func (c *datapathCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.packets, c.bytes, c.epPackets, c.epBytes, c.entries, c.capacity, c.pinned, c.current, c.attached, c.healed, c.pending, c.scrapeErrors} {
		ch <- d
	}
}

func (c *datapathCollector) Collect(ch chan<- prometheus.Metric) {
	s := &scrape{ch: ch, log: c.log, n: c.n}
	c.collectNode(s)
	names := c.collectAttachments(s)
	c.collectDevices(s, names)
	c.collectFill(s)
	c.collectPrograms(s)
	if ago, err := c.n.SinceRepaired(); err == nil {
		ch <- prometheus.MustNewConstMetric(c.healed, prometheus.GaugeValue, float64(time.Now().Add(-ago).UnixMilli())/1000)
	}
	c.collectPending(s)
	ch <- prometheus.MustNewConstMetric(c.scrapeErrors, prometheus.GaugeValue, float64(s.failed))
}

// scrape is one Collect: where its metrics go, and how many sources it
// could not read.
type scrape struct {
	ch     chan<- prometheus.Metric
	log    *slog.Logger
	n      *nodestate.Node
	failed int
}

func (s *scrape) fail(what string, err error) {
	s.failed++
	s.log.Warn("metrics: cannot read "+what, "err", err)
}

// open opens pinned map name read-only, or returns nil. A map that is not
// pinned yet is no error: nothing created it.
func (s *scrape) open(name string) *ebpf.Map {
	m, err := s.n.ReadMap(name)
	if err != nil {
		if !errors.Is(err, maps.ErrNotPinned) {
			s.fail(name, err)
		}
		return nil
	}
	return m
}

// collectNode sends the node-wide counters, every reason in both
// directions.
func (c *datapathCollector) collectNode(s *scrape) {
	m := s.open(maps.CniMapNodeCounters)
	if m == nil {
		return
	}
	by, err := counters.SumNode(m)
	m.Close()
	if err != nil {
		s.fail(maps.CniMapNodeCounters, err)
	}
	for _, r := range maps.PktReasons {
		for _, d := range counters.Dirs {
			v := by[r.Reason][d]
			s.ch <- prometheus.MustNewConstMetric(c.packets, prometheus.CounterValue, float64(v.Packets), r.Key, counters.DirKeys[d])
			s.ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(v.Bytes), r.Key, counters.DirKeys[d])
		}
	}
}

// collectAttachments sends the endpoints' attachments by mode, from the
// records, and returns the devices' names by ifindex (the pods' host veths
// and the attachment sets' devices).
func (c *datapathCollector) collectAttachments(s *scrape) map[uint32]string {
	recs, err := c.n.Records()
	if err != nil {
		s.fail("endpoint records", err)
	}
	names := map[uint32]string{}
	modes := map[string]int{}
	for _, r := range recs {
		names[uint32(r.HostIfIndex)] = r.HostIfName
		for _, a := range r.Attachments {
			modes[string(a.Mode)]++
		}
	}
	if sets, err := c.n.AttachmentSets(""); err == nil {
		for _, set := range sets {
			if set.IfIndex != 0 {
				names[uint32(set.IfIndex)] = set.Name
			}
		}
	} else {
		s.fail("attachment sets", err)
	}
	modeNames := make([]string, 0, len(modes))
	for m := range modes {
		modeNames = append(modeNames, m)
	}
	sort.Strings(modeNames)
	for _, m := range modeNames {
		s.ch <- prometheus.MustNewConstMetric(c.attached, prometheus.GaugeValue, float64(modes[m]), m)
	}
	return names
}

// collectDevices sends each device's non-zero counters, labelled with its
// name (names, else its ifindex) and its owner.
func (c *datapathCollector) collectDevices(s *scrape, names map[uint32]string) {
	d, done, err := counters.PinnedDevices(c.n.BPFRoot(), true)
	if err != nil {
		s.fail("device counters", err)
		return
	}
	devs, err := d.Sum()
	done()
	if err != nil {
		s.fail("device counters", err)
	}
	owners := c.owners(s)
	for ifindex, by := range devs {
		o := owners[ifindex]
		dev := names[ifindex]
		if dev == "" {
			dev = "ifindex " + strconv.FormatUint(uint64(ifindex), 10)
		}
		for r, b := range by {
			for _, d := range counters.Dirs {
				if b[d].Packets == 0 && b[d].Bytes == 0 {
					continue
				}
				l := []string{o.pod.Namespace, o.pod.Name, o.containerID, o.ifname, dev, counters.ReasonKeys[r], counters.DirKeys[d]}
				s.ch <- prometheus.MustNewConstMetric(c.epPackets, prometheus.CounterValue, float64(b[d].Packets), l...)
				s.ch <- prometheus.MustNewConstMetric(c.epBytes, prometheus.CounterValue, float64(b[d].Bytes), l...)
			}
		}
	}
}

// collectFill sends how full each map that can fill is.
func (c *datapathCollector) collectFill(s *scrape) {
	fills, errs := maps.ReadFill(c.n.BPFRoot())
	for _, err := range errs {
		s.fail("map fill", err)
	}
	for _, f := range fills {
		s.ch <- prometheus.MustNewConstMetric(c.entries, prometheus.GaugeValue, float64(f.Entries), f.Name)
		s.ch <- prometheus.MustNewConstMetric(c.capacity, prometheus.GaugeValue, float64(f.Capacity), f.Name)
	}
}

// collectPrograms sends the program sets pinned, and whether the agent's
// build is one of them.
func (c *datapathCollector) collectPrograms(s *scrape) {
	tags, err := programs.Installed(c.n.BPFRoot())
	if err != nil {
		s.fail("pinned programs", err)
	}
	current := 0.0
	for _, t := range tags {
		s.ch <- prometheus.MustNewConstMetric(c.pinned, prometheus.GaugeValue, 1, t)
		if t == features.Tag() {
			current = 1
		}
	}
	s.ch <- prometheus.MustNewConstMetric(c.current, prometheus.GaugeValue, current)
}

// owner is who a device's counters belong to.
type owner struct {
	containerID, ifname string
	pod                 endpoint.Pod
}

// owners reads endpoint_devs (the attachment) and endpoint_pods (the pod)
// by host ifindex: the kernel's view, not the records'.
func (c *datapathCollector) owners(s *scrape) map[uint32]owner {
	out := map[uint32]owner{}
	if m := s.open(maps.CniMapEndpointDevs); m != nil {
		var k uint32
		var v maps.CniEndpointDev
		it := m.Iterate()
		for it.Next(&k, &v) {
			out[k] = owner{containerID: maps.GoString(v.ContainerId[:]), ifname: maps.GoString(v.Ifname[:])}
		}
		if err := it.Err(); err != nil {
			s.fail(maps.CniMapEndpointDevs, fmt.Errorf("iterating: %w", err))
		}
		m.Close()
	}
	if m := s.open(maps.CniMapEndpointPods); m != nil {
		pods, err := endpoint.ReadPods(m)
		m.Close()
		if err != nil {
			s.fail(maps.CniMapEndpointPods, err)
		}
		for k, p := range pods {
			o := out[k]
			o.pod = p
			out[k] = o
		}
	}
	return out
}

// collectPending runs the plugin's repair as a dry run (pkg/repair: it
// changes nothing, and skips an attachment a plugin call is working on)
// and counts what it would mend. Without a bpffs there is nothing to
// count: the policy's and the routes' status say so.
func (c *datapathCollector) collectPending(s *scrape) {
	nd := c.n.Reopen()
	defer nd.Close()
	if nd.CheckBPFFS() != nil {
		return
	}
	h, err := repair.Run(nd, repair.Options{DryRun: true})
	if err != nil {
		s.fail("the repair's dry run", err)
		return
	}
	restore, err := repair.Unrestored(nd)
	if err != nil {
		s.fail("the features' state of the endpoints", err)
	}
	for kind, n := range map[string]int{"rebuild": len(h.Rebuilt), "reclaim": len(h.Reclaimed), "remove": len(h.Removed), "restore": len(restore), "problem": len(h.Problems)} {
		s.ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(n), kind)
	}
}
