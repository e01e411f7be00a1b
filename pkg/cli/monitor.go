package cli

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/counters"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/events"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

func init() {
	register(&Command{
		Name:    "monitor",
		Summary: "print drops (and sampled flow starts and ends) as they happen, until interrupted",
		Help: `One line per event, as the datapath reports it: drops by the programs
(reason as in counters: drop_spoof_src, drop_no_endpoint, ...), drops of a
pod's packets by the kernel (kernel-drop, with the kernel's reason:
no_socket for a port nothing listens on, a hostPort the pod does not
serve, netfilter_drop, ...), and with --flows sampled flow starts (TCP
SYN, a new UDP flow handed to netfilter) and ends (TCP FIN or RST). Each
names the time, the pod (namespace/name when the runtime passed K8S_POD_*,
else containerID/ifname; an uplink by its name), the direction seen from
the pod (or the node, on an uplink), the protocol and the addresses and
ports. A line "# stats" (JSON: type "stats") says what the rate limit
suppressed and what a full ring buffer lost, every --stats and at exit.

While it runs the stream is on: the datapath's cost per packet grows only
then (docs/operations.md). It renews a lease every second; killed, the
stream switches itself off within 3 s. One monitor at a time per node (a
ring buffer has one reader): a second one is refused, naming the first's
pid. Stop it with Ctrl-C (SIGINT) or SIGTERM.

JSON, one object per line: {"type": "start", "time", "rate", "burst",
"flows", "flowSample", "kernelDrops"}; then events {"type": "drop" |
"kernel-drop" | "flow-start" | "flow-end", "time" (RFC 3339, ns), "pod":
{"namespace", "name"}, "containerID", "ifname", "device", "ifindex",
"reason", "reasonText", "direction" (egress, ingress), "protocol", "src",
"srcPort", "dst", "dstPort", "srcMAC", "tcpFlags", "len", "arp",
"fragment"} (fields it does not know are left out); and {"type": "stats",
"time", "final", "events", "suppressed": {<reason>: n}, "lost": {<reason>:
n}, "flowSuppressed", "flowLost", "kernelSuppressed", "kernelLost"},
counted since the monitor started.`,
		Flags: func(fs *flag.FlagSet) func(*Context) error {
			o := &monitorOpts{}
			fs.BoolVar(&o.flows, "flows", false, "also report sampled flow starts and ends")
			fs.StringVar(&o.typ, "type", "", "`drop|flow`: only drops (the programs' and the kernel's), or only flows (implies --flows)")
			fs.StringVar(&o.pod, "pod", "", "only the events of pod `NAMESPACE/NAME` (or containerID/ifname)")
			fs.Uint64Var(&o.rate, "rate", events.DefaultRate, "at most `N` events per second per CPU; the rest are counted as suppressed")
			fs.Uint64Var(&o.burst, "burst", 0, "`N` events a CPU may send at once after a quiet spell (0: rate/10)")
			fs.UintVar(&o.sample, "sample", events.DefaultFlowSample, "report one flow in `N` (by a hash of its addresses and ports: a reported flow has its start and its end)")
			fs.DurationVar(&o.stats, "stats", 10*time.Second, "print the suppressed and lost counts every `DURATION` (0: at exit only)")
			fs.BoolVar(&o.kernel, "kernel-drops", true, "report the kernel's drops of pods' packets (a kfree_skb tracer while it runs)")
			return func(ctx *Context) error { return runMonitor(ctx, o) }
		},
	})
}

type monitorOpts struct {
	flows, kernel bool
	typ, pod      string
	rate, burst   uint64
	sample        uint
	stats         time.Duration
}

// MonitorPod is an event's pod identity.
type MonitorPod struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// MonitorEvent is one event of `monitor -o json`.
type MonitorEvent struct {
	Type        string      `json:"type"`
	Time        time.Time   `json:"time"`
	Pod         *MonitorPod `json:"pod,omitempty"`
	ContainerID string      `json:"containerID,omitempty"`
	IfName      string      `json:"ifname,omitempty"`
	Device      string      `json:"device,omitempty"`
	IfIndex     uint32      `json:"ifindex"`
	Reason      string      `json:"reason"`
	ReasonText  string      `json:"reasonText"`
	Direction   string      `json:"direction,omitempty"`
	Protocol    string      `json:"protocol,omitempty"`
	Src         string      `json:"src,omitempty"`
	SrcPort     uint16      `json:"srcPort,omitempty"`
	Dst         string      `json:"dst,omitempty"`
	DstPort     uint16      `json:"dstPort,omitempty"`
	SrcMAC      string      `json:"srcMAC,omitempty"`
	TCPFlags    string      `json:"tcpFlags,omitempty"`
	Len         uint32      `json:"len"`
	ARP         bool        `json:"arp,omitempty"`
	Fragment    bool        `json:"fragment,omitempty"`
}

// MonitorStats is the "stats" object of `monitor -o json`.
type MonitorStats struct {
	Type             string            `json:"type"`
	Time             time.Time         `json:"time"`
	Final            bool              `json:"final"`
	Events           uint64            `json:"events"`
	Suppressed       map[string]uint64 `json:"suppressed"`
	Lost             map[string]uint64 `json:"lost"`
	FlowSuppressed   uint64            `json:"flowSuppressed"`
	FlowLost         uint64            `json:"flowLost"`
	KernelSuppressed uint64            `json:"kernelSuppressed"`
	KernelLost       uint64            `json:"kernelLost"`
}

// MonitorStart is the first object of `monitor -o json`.
type MonitorStart struct {
	Type        string    `json:"type"`
	Time        time.Time `json:"time"`
	Rate        uint64    `json:"rate"`
	Burst       uint64    `json:"burst"`
	Flows       bool      `json:"flows"`
	FlowSample  uint      `json:"flowSample"`
	KernelDrops bool      `json:"kernelDrops"`
}

func runMonitor(ctx *Context, o *monitorOpts) error {
	if err := o.check(); err != nil {
		return err
	}
	if err := ctx.CheckRoot(); err != nil {
		return err
	}
	s, closeMaps, err := openStream(ctx)
	if err != nil {
		return err
	}
	defer closeMaps()
	defer s.Close()
	m := &monitoring{ctx: ctx, o: o, s: s, r: &resolver{ctx: ctx}}
	if o.kernel {
		defer m.traceKernelDrops()()
	}
	m.r.refresh()

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(stop)
	if err := s.Start(events.Options{Rate: o.rate, Burst: o.burst, Flows: o.flows, FlowSample: uint32(o.sample)}); err != nil {
		return err
	}
	start := MonitorStart{Type: "start", Time: time.Now(), Rate: o.rate, Burst: o.burst, Flows: o.flows, FlowSample: o.sample, KernelDrops: m.r.tracer != nil}
	if ctx.JSON {
		if err := writeJSONLine(ctx, start); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(ctx.Stdout, "# monitoring: at most %d events/s per CPU (burst %d), flows %v (1 in %d), kernel drops %v; Ctrl-C to stop\n",
			o.rate, o.burst, o.flows, o.sample, m.r.tracer != nil)
	}
	return m.loop(stop)
}

// check validates the options and fills in their defaults.
func (o *monitorOpts) check() error {
	switch o.typ {
	case "", "drop":
	case "flow":
		o.flows = true
	default:
		return view.Usage("--type %q: want drop or flow", o.typ)
	}
	if o.rate == 0 {
		return view.Usage("--rate 0: want at least 1 event per second")
	}
	if o.burst == 0 {
		o.burst = max(o.rate/10, 1)
	}
	return nil
}

// openStream opens the node's event stream (its maps writable: the
// lease, the ring's consumer position); closeMaps releases the maps.
func openStream(ctx *Context) (s *events.Stream, closeMaps func(), err error) {
	ms := map[string]*ebpf.Map{}
	closeMaps = func() {
		for _, m := range ms {
			m.Close()
		}
	}
	for _, name := range events.Maps {
		m, err := ctx.OpenMapWritable(name)
		if errors.Is(err, view.ErrNoMap) {
			err = fmt.Errorf("%w: the programs of this node predate the event stream; they load it with the next ADD after an upgrade", err)
		}
		if err != nil {
			closeMaps()
			return nil, nil, err
		}
		ms[name] = m
	}
	s, err = events.Open(ms[maps.CniMapEvents], ms[maps.CniMapEventsConfig], ms[maps.CniMapEventsStats], maps.Dir(ctx.Node.BPFRoot()))
	if errors.Is(err, events.ErrBusy) {
		err = fmt.Errorf("%w: another ebpf-cni monitor reads this node's events (a ring buffer has one reader: two would each see a part); stop it, or read its output", err)
	}
	if err != nil {
		closeMaps()
		return nil, nil, err
	}
	return s, closeMaps, nil
}

// monitoring is one run of monitor: the stream, the names it resolves,
// how many events it printed.
type monitoring struct {
	ctx         *Context
	o           *monitorOpts
	s           *events.Stream
	r           *resolver
	kernelNames map[uint32]string
	n           uint64
}

// traceKernelDrops attaches the kernel drops' tracer, or says on stderr
// why there is none; it returns what detaches it.
func (m *monitoring) traceKernelDrops() func() {
	tracer, err := m.s.TraceKernelDrops()
	if err == nil {
		m.kernelNames, err = events.KernelReasons()
	}
	if err != nil {
		fmt.Fprintf(m.ctx.Stderr, "ebpf-cni monitor: no kernel drops: %v\n", err)
		if tracer != nil {
			tracer.Close()
		}
		return func() {}
	}
	m.r.tracer = tracer
	return func() { tracer.Close() }
}

// printStats prints the stream's counts so far (final: at the end).
func (m *monitoring) printStats(final bool) error {
	st, err := m.s.Stats()
	if err != nil {
		return err
	}
	return writeMonitorStats(m.ctx, monitorStats(st, m.n, final))
}

// emit prints one event the options want.
func (m *monitoring) emit(ev *maps.CniEvent) error {
	me := m.r.event(m.s, ev, m.kernelNames)
	if !m.o.wants(me) {
		return nil
	}
	m.n++
	if m.ctx.JSON {
		return writeJSONLine(m.ctx, me)
	}
	_, err := fmt.Fprintln(m.ctx.Stdout, me.line())
	return err
}

// loop prints events until stop: the lease renewed each second, the
// counts every --stats.
func (m *monitoring) loop(stop <-chan os.Signal) error {
	renew := time.Now().Add(time.Second)
	nextStats := time.Now().Add(m.o.stats)
	for {
		select {
		case <-stop:
			return m.drain()
		default:
		}
		now := time.Now()
		if !now.Before(renew) {
			if err := m.s.Renew(); err != nil {
				return err
			}
			m.r.tick()
			renew = now.Add(time.Second)
		}
		if m.o.stats > 0 && !now.Before(nextStats) {
			if err := m.printStats(false); err != nil {
				return err
			}
			nextStats = now.Add(m.o.stats)
		}
		ev, err := m.s.Read(renew)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			continue
		}
		if err != nil {
			return err
		}
		if err := m.emit(&ev); err != nil {
			return err
		}
	}
}

// drain ends the run: the stream off first, then what the ring still
// holds, so that the final counts cover every event the lease let through.
func (m *monitoring) drain() error {
	if err := m.s.Off(); err != nil {
		return err
	}
	for {
		ev, err := m.s.Read(time.Now())
		if err != nil {
			break
		}
		if err := m.emit(&ev); err != nil {
			return err
		}
	}
	return m.printStats(true)
}

func (o *monitorOpts) wants(e *MonitorEvent) bool {
	flow := strings.HasPrefix(e.Type, "flow")
	if (o.typ == "drop" && flow) || (o.typ == "flow" && !flow) {
		return false
	}
	pod := ""
	if e.Pod != nil {
		pod = e.Pod.Namespace + "/" + e.Pod.Name
	}
	return podIs(o.pod, pod, e.ContainerID, e.IfName)
}

// podIs: the --pod filter want ("" matches all) names the pod (its
// namespace/name; "": none known), or the attachment containerID/ifname
// (the ID whole, or cut as tables show it).
func podIs(want, pod, containerID, ifName string) bool {
	if want == "" {
		return true
	}
	if pod != "" && pod == want {
		return true
	}
	return containerID != "" && (containerID+"/"+ifName == want || view.Name(containerID, ifName) == want)
}

func writeJSONLine(ctx *Context, v any) error { return view.WriteJSONLine(ctx.Stdout, v) }

func monitorStats(st events.Stats, n uint64, final bool) MonitorStats {
	out := MonitorStats{Type: "stats", Time: time.Now(), Final: final, Events: n, Suppressed: map[string]uint64{}, Lost: map[string]uint64{},
		FlowSuppressed: st.FlowSuppressed, FlowLost: st.FlowLost, KernelSuppressed: st.KernelSuppressed, KernelLost: st.KernelLost}
	for r, v := range st.Suppressed {
		if v != 0 {
			out.Suppressed[reasonKey(r)] = v
		}
	}
	for r, v := range st.Lost {
		if v != 0 {
			out.Lost[reasonKey(r)] = v
		}
	}
	return out
}

func writeMonitorStats(ctx *Context, st MonitorStats) error {
	if ctx.JSON {
		return writeJSONLine(ctx, st)
	}
	var sup, lost uint64
	var parts []string
	for k, v := range st.Suppressed {
		sup += v
		parts = append(parts, fmt.Sprintf("%s %d", k, v))
	}
	for _, v := range st.Lost {
		lost += v
	}
	sort.Strings(parts)
	sup += st.FlowSuppressed + st.KernelSuppressed
	lost += st.FlowLost + st.KernelLost
	what := "# stats"
	if st.Final {
		what = "# final stats"
	}
	detail := ""
	if len(parts) > 0 {
		detail = " (" + strings.Join(parts, ", ") + ")"
	}
	_, err := fmt.Fprintf(ctx.Stdout, "%s: %d events shown, %d suppressed by the rate limit%s, %d lost (ring buffer full)\n", what, st.Events, sup, detail, lost)
	return err
}

func reasonKey(r maps.CniPktReason) string {
	if k, ok := counters.ReasonKeys[r]; ok {
		return k
	}
	return fmt.Sprintf("reason_%d", r)
}

var eventTypes = map[maps.CniEventType]string{
	maps.CniEventTypeEVENT_DROP:        "drop",
	maps.CniEventTypeEVENT_FLOW_START:  "flow-start",
	maps.CniEventTypeEVENT_FLOW_END:    "flow-end",
	maps.CniEventTypeEVENT_KERNEL_DROP: "kernel-drop",
}

var protocols = map[uint8]string{1: "icmp", 6: "tcp", 17: "udp", 58: "icmpv6", 132: "sctp"}

func tcpFlags(f uint8) string {
	var out []string
	for i, n := range []string{"FIN", "SYN", "RST", "PSH", "ACK", "URG"} {
		if f&(1<<i) != 0 {
			out = append(out, n)
		}
	}
	return strings.Join(out, ",")
}

// resolver names the devices of events: endpoint_devs and endpoint_pods
// by host ifindex, an uplink by its name; read again when an ifindex is
// unknown (at most once a second) and every few seconds.
type resolver struct {
	ctx    *Context
	devs   map[uint32]maps.CniEndpointDev
	pods   map[uint32]endpoint.Pod
	names  map[uint32]string
	read   time.Time
	tracer *events.Tracer
	ticks  int
}

func (r *resolver) refresh() {
	r.read = time.Now()
	r.devs, r.pods, r.names = map[uint32]maps.CniEndpointDev{}, map[uint32]endpoint.Pod{}, map[uint32]string{}
	if m, err := r.ctx.OpenMap(maps.CniMapEndpointDevs); err == nil {
		var k uint32
		var d maps.CniEndpointDev
		for it := m.Iterate(); it.Next(&k, &d); {
			r.devs[k] = d
		}
		m.Close()
	}
	if m, err := r.ctx.OpenMap(maps.CniMapEndpointPods); err == nil {
		if p, err := endpoint.ReadPods(m); err == nil {
			r.pods = p
		}
		m.Close()
	}
	if r.tracer != nil {
		if err := r.tracer.SetPods(podDevs(r.ctx.Node)); err != nil {
			fmt.Fprintf(r.ctx.Stderr, "ebpf-cni monitor: pods for the kernel drops: %v\n", err)
		}
	}
}

// tick runs every second: everything is read again every 5 s.
func (r *resolver) tick() {
	if r.ticks++; r.ticks%5 == 0 {
		r.refresh()
	}
}

// podDevs are the devices of the pods' network namespaces, from their
// records: the namespace's inode number with the pod's ifindex (the host
// veth's peer) and with 0 (any other device there).
func podDevs(nd *node.Node) map[events.PodDev]uint32 {
	out := map[events.PodDev]uint32{}
	recs, err := nd.Records()
	if err != nil {
		return out
	}
	for _, rec := range recs {
		var st unix.Stat_t
		if rec.NetNS == "" || unix.Stat(rec.NetNS, &st) != nil {
			continue
		}
		host := uint32(rec.HostIfIndex)
		any := events.PodDev{Netns: uint32(st.Ino)}
		if _, ok := out[any]; !ok {
			out[any] = host
		}
		if l, err := netlink.LinkByIndex(rec.HostIfIndex); err == nil && l.Attrs().ParentIndex > 0 {
			out[events.PodDev{Netns: uint32(st.Ino), Ifindex: uint32(l.Attrs().ParentIndex)}] = host
		}
	}
	return out
}

func (r *resolver) event(s *events.Stream, ev *maps.CniEvent, kernelNames map[uint32]string) *MonitorEvent {
	if _, ok := r.devs[ev.Ifindex]; !ok && r.names[ev.Ifindex] == "" && time.Since(r.read) > time.Second {
		r.refresh()
	}
	e := &MonitorEvent{Type: eventTypes[ev.Type], Time: s.Time(ev.Time), IfIndex: ev.Ifindex, Len: ev.Len,
		ARP: ev.Flags&maps.CniEventFlagsEVENT_F_ARP != 0, Fragment: ev.Flags&maps.CniEventFlagsEVENT_F_FRAG != 0}
	if e.Type == "" {
		e.Type = fmt.Sprintf("type_%d", ev.Type)
	}
	d, isPod := r.devs[ev.Ifindex]
	if isPod {
		e.ContainerID, e.IfName = maps.GoString(d.ContainerId[:]), maps.GoString(d.Ifname[:])
		if p, ok := r.pods[ev.Ifindex]; ok {
			e.Pod = &MonitorPod{Namespace: p.Namespace, Name: p.Name}
		}
	} else if name, ok := r.names[ev.Ifindex]; ok {
		e.Device = name
	} else if l, err := netlink.LinkByIndex(int(ev.Ifindex)); err == nil {
		e.Device = l.Attrs().Name
		r.names[ev.Ifindex] = e.Device
	}
	if ev.Type == maps.CniEventTypeEVENT_KERNEL_DROP {
		name := kernelNames[uint32(ev.Reason)]
		if name == "" {
			name = fmt.Sprintf("%d", ev.Reason)
		}
		e.Reason, e.ReasonText = strings.ToLower(name), "kernel: "+name
	} else {
		e.Reason = reasonKey(maps.CniPktReason(ev.Reason))
		e.ReasonText = counters.ReasonNames[maps.CniPktReason(ev.Reason)]
	}
	src, dst := events.Addrs(ev)
	switch ev.Dir {
	case uint8(maps.CniPktDirPKT_DIR_EGRESS):
		e.Direction = "egress"
	case uint8(maps.CniPktDirPKT_DIR_INGRESS):
		e.Direction = "ingress"
	default: // a kernel drop: toward the pod when it is the destination
		if isPod && dst.IsValid() {
			e.Direction = "egress"
			for _, a := range maps.EndpointIPs(&d) {
				if ip, ok := netip.AddrFromSlice(a); ok && ip.Unmap() == dst.Unmap() {
					e.Direction = "ingress"
				}
			}
		}
	}
	if src.IsValid() {
		e.Src, e.Dst = src.String(), dst.String()
	}
	if e.ARP {
		e.Protocol = "arp"
	} else if ev.Family != 0 {
		if e.Protocol = protocols[ev.Proto]; e.Protocol == "" {
			e.Protocol = fmt.Sprintf("%d", ev.Proto)
		}
	}
	e.SrcPort, e.DstPort = maps.Port(ev.Sport), maps.Port(ev.Dport)
	if ev.Mac != [6]uint8{} {
		e.SrcMAC = fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", ev.Mac[0], ev.Mac[1], ev.Mac[2], ev.Mac[3], ev.Mac[4], ev.Mac[5])
	}
	if ev.Proto == 6 && !e.ARP {
		e.TCPFlags = tcpFlags(ev.TcpFlags)
	}
	return e
}

// who is how a line names an event's device.
func (e *MonitorEvent) who() string {
	switch {
	case e.Pod != nil:
		return e.Pod.Namespace + "/" + e.Pod.Name
	case e.ContainerID != "":
		return view.Name(e.ContainerID, e.IfName)
	case e.Device != "":
		return e.Device
	}
	return fmt.Sprintf("ifindex %d", e.IfIndex)
}

func hostPort(a string, p uint16) string {
	if a == "" {
		return "?"
	}
	if p == 0 {
		return a
	}
	return netip.AddrPortFrom(netip.MustParseAddr(a), p).String()
}

// line is the table form of an event.
func (e *MonitorEvent) line() string {
	proto := view.OrDash(e.Protocol)
	if e.TCPFlags != "" {
		proto += " " + e.TCPFlags
	}
	what := e.Src
	if e.Src != "" {
		what = hostPort(e.Src, e.SrcPort) + " -> " + hostPort(e.Dst, e.DstPort)
	}
	if e.SrcMAC != "" && (e.Reason == "drop_spoof_mac" || e.ARP) {
		what += " from " + e.SrcMAC
	}
	return fmt.Sprintf("%s  %-11s %-24s %-22s %-7s %-12s %s  len %d", e.Time.Format("15:04:05.000000"), e.Type, e.who(),
		e.Reason, view.OrDash(e.Direction), proto, view.OrDash(what), e.Len)
}
