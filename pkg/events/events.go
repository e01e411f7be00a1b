// Package events reads the datapath's live event stream (bpf/lib/events.h):
// it holds the lease that switches the stream on, drains the ring buffer,
// decodes its records and sums what the rate limit suppressed and the full
// ring lost; with the kernel's drops of pods' packets (bpf/kfree_skb.c)
// while it runs. `ebpf-cni monitor` and the bench read the stream with it.
package events

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// Maps are the pinned maps of the stream, opened for writing.
var Maps = []string{maps.CniMapEvents, maps.CniMapEventsConfig, maps.CniMapEventsStats}

// LeaseTime is how long a lease lasts: a reader renews it every second
// (Renew), so a killed one switches the stream off within LeaseTime.
const LeaseTime = 3 * time.Second

// Options configure the stream while a reader holds it.
type Options struct {
	Rate  uint64 // events per second per CPU; 0: DefaultRate
	Burst uint64 // events a CPU may send at once after a quiet spell; 0: Rate/10, at least 1
	// Flows reports sampled flow starts and ends; FlowSample N reports
	// one flow in N (0 or 1: every flow).
	Flows      bool
	FlowSample uint32
}

// DefaultRate is the rate limit when Options.Rate is 0.
const DefaultRate = 1000

// DefaultFlowSample is `monitor --flows`'s sampling: one flow in 10.
const DefaultFlowSample = 10

func (o Options) config(pid int, lease uint64) maps.CniEventConfig {
	rate := o.Rate
	if rate == 0 {
		rate = DefaultRate
	}
	burst := o.Burst
	if burst == 0 {
		burst = max(rate/10, 1)
	}
	per := uint64(time.Second) / rate
	if per == 0 {
		per = 1
	}
	c := maps.CniEventConfig{Lease: lease, NsPerEvent: per, Burst: (burst - 1) * per, FlowSample: o.FlowSample, ReaderPid: uint32(pid)}
	if o.Flows {
		c.Flags = uint32(maps.CniEventConfigFlagsEVENT_CF_FLOWS)
	}
	return c
}

// ErrBusy means another reader holds the stream: a BPF ring buffer has one
// consumer position, two readers would each get a part of the events.
var ErrBusy = errors.New("another reader holds the event stream")

// Stream is the node's event stream, held by this process.
type Stream struct {
	ring, config, stats *ebpf.Map
	lock                *os.File
	rd                  *ringbuf.Reader
	opts                Options
	base                Stats
	// monotonic clock at wall time wall: converts event times
	mono uint64
	wall time.Time
}

// Open takes the stream of the maps (opened writable: the ring buffer's
// consumer position is written through its mapping) for this process:
// ErrBusy, naming the reader's pid, when another one holds it. lockDir is
// a directory every reader of the node locks (the maps' directory); the
// lock goes with the process, however it ends. The caller keeps owning
// the maps.
func Open(ring, config, stats *ebpf.Map, lockDir string) (*Stream, error) {
	f, err := os.Open(lockDir)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			var c maps.CniEventConfig
			if config.Lookup(uint32(0), &c) == nil && c.ReaderPid != 0 {
				return nil, fmt.Errorf("%w (pid %d)", ErrBusy, c.ReaderPid)
			}
			return nil, ErrBusy
		}
		return nil, fmt.Errorf("locking %s: %w", lockDir, err)
	}
	rd, err := ringbuf.NewReader(ring)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("reading the ring buffer %s: %w", maps.CniMapEvents, err)
	}
	// Whatever a reader killed earlier left in the ring is stale.
	rd.SetDeadline(time.Now())
	for {
		if _, err := rd.Read(); err != nil {
			break
		}
	}
	return &Stream{ring: ring, config: config, stats: stats, lock: f, rd: rd}, nil
}

// Start switches the stream on with o: what Stats reports counts from here.
func (s *Stream) Start(o Options) error {
	base, err := s.readStats()
	if err != nil {
		return err
	}
	s.base, s.opts = base, o
	s.wall, s.mono = time.Now(), maps.Monotonic()
	return s.Renew()
}

// Renew extends the lease by LeaseTime; call it every second.
func (s *Stream) Renew() error {
	c := s.opts.config(os.Getpid(), maps.Monotonic()+uint64(LeaseTime))
	if err := s.config.Put(uint32(0), &c); err != nil {
		return fmt.Errorf("writing %s: %w", maps.CniMapEventsConfig, err)
	}
	return nil
}

// Off switches the stream off: what the ring holds can still be read.
func (s *Stream) Off() error {
	var off maps.CniEventConfig
	if err := s.config.Put(uint32(0), &off); err != nil {
		return fmt.Errorf("writing %s: %w", maps.CniMapEventsConfig, err)
	}
	return nil
}

// Close switches the stream off and lets another reader take it.
func (s *Stream) Close() error {
	err := s.Off()
	s.rd.Close()
	s.lock.Close()
	return err
}

// Time is the wall time of an event's monotonic timestamp.
func (s *Stream) Time(mono uint64) time.Time {
	return s.wall.Add(time.Duration(int64(mono - s.mono)))
}

// Poll is how often a reader looks into the ring at least: the programs
// wake it only when a backlog builds up (bpf/lib/events.h).
const Poll = 100 * time.Millisecond

// Read waits for the next record until deadline (os.ErrDeadlineExceeded
// then), looking every Poll: the programs do not wake the reader for
// every event.
func (s *Stream) Read(deadline time.Time) (maps.CniEvent, error) {
	var ev maps.CniEvent
	var r ringbuf.Record
	for {
		d := time.Now().Add(Poll)
		if deadline.Before(d) {
			d = deadline
		}
		s.rd.SetDeadline(d)
		err := s.rd.ReadInto(&r)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) || !time.Now().Before(deadline) {
			return ev, err
		}
	}
	if err := binary.Read(bytes.NewReader(r.RawSample), binary.LittleEndian, &ev); err != nil {
		return ev, fmt.Errorf("decoding an event of %d bytes: %w", len(r.RawSample), err)
	}
	return ev, nil
}

// Stats are what the stream could not deliver, summed over CPUs.
type Stats struct {
	Suppressed       map[maps.CniPktReason]uint64 // drops the rate limit kept out
	Lost             map[maps.CniPktReason]uint64 // drops the full ring had no room for
	FlowSuppressed   uint64
	FlowLost         uint64
	KernelSuppressed uint64
	KernelLost       uint64
}

func (s *Stream) readStats() (Stats, error) {
	var per []maps.CniEventStats
	if err := s.stats.Lookup(uint32(0), &per); err != nil {
		return Stats{}, fmt.Errorf("reading %s: %w", maps.CniMapEventsStats, err)
	}
	out := Stats{Suppressed: map[maps.CniPktReason]uint64{}, Lost: map[maps.CniPktReason]uint64{}}
	for _, c := range per {
		for r := range c.Suppressed {
			out.Suppressed[maps.CniPktReason(r)] += c.Suppressed[r]
			out.Lost[maps.CniPktReason(r)] += c.Lost[r]
		}
		out.FlowSuppressed += c.FlowSuppressed
		out.FlowLost += c.FlowLost
		out.KernelSuppressed += c.KernelSuppressed
		out.KernelLost += c.KernelLost
	}
	return out, nil
}

// Stats is what was suppressed and lost since Start.
func (s *Stream) Stats() (Stats, error) {
	now, err := s.readStats()
	if err != nil {
		return now, err
	}
	for r, n := range now.Suppressed {
		now.Suppressed[r] = n - s.base.Suppressed[r]
		now.Lost[r] -= s.base.Lost[r]
	}
	now.FlowSuppressed -= s.base.FlowSuppressed
	now.FlowLost -= s.base.FlowLost
	now.KernelSuppressed -= s.base.KernelSuppressed
	now.KernelLost -= s.base.KernelLost
	return now, nil
}

// Addrs are an event's addresses (invalid when it held none).
func Addrs(ev *maps.CniEvent) (src, dst netip.Addr) {
	switch ev.Family {
	case uint8(maps.CniAddrFamilyADDR_FAMILY_V4):
		return netip.AddrFrom4([4]byte(ev.Saddr[:4])), netip.AddrFrom4([4]byte(ev.Daddr[:4]))
	case uint8(maps.CniAddrFamilyADDR_FAMILY_V6):
		return netip.AddrFrom16(ev.Saddr), netip.AddrFrom16(ev.Daddr)
	}
	return netip.Addr{}, netip.Addr{}
}
