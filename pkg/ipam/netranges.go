package ipam

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/config"
)

// Two networks of a node must not share addresses: each hands out its own
// (ipam_allocs is keyed by network), so the second would give a pod an
// address a pod of the first holds, and ebpf-cni would find it mapped to
// another endpoint only after IPAM (code 115). Each network records the
// ranges it hands addresses out of in its state directory while it holds
// addresses on the node (Forget removes it with the rest), and a network
// whose ranges overlap another's recorded ones is refused by its ADD
// (claimRanges, code 7) and STATUS (sharedRange, code 50). Whichever
// holds addresses first keeps the range.

// rangesFile, in a network's directory, holds one line per range it has
// handed addresses out of since it last held none: "start end subnet". A
// record, rebuilt by the network's next ADD if lost.
const rangesFile = "ranges"

func rangeLine(r *Range) string { return fmt.Sprintf("%s %s %s", r.Start, r.End, &r.Subnet) }

// rangeKey names range j of set i as the configuration does.
func (c *Config) rangeKey(i, j int) string {
	if c.RangesKey == "ipam" {
		return "ipam.subnet"
	}
	return fmt.Sprintf("%s[%d][%d]", c.RangesKey, i, j)
}

// claimRanges records c's ranges as the network's, refusing them when
// another network's recorded ranges overlap them. An ADD calls it with the
// network's lock held, before it allocates. Ranges recorded already cost
// one small read: the others are read, under a lock of every network's
// (their parent directory's), only when a range is new to the network.
func (s *Store) claimRanges(c *Config) error {
	path := filepath.Join(s.dir, rangesFile)
	have, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return stateError("stateDir", err)
	}
	known := map[string]bool{}
	for _, l := range strings.Split(string(have), "\n") {
		known[l] = true
	}
	var add []string
	for i := range c.RangeSets {
		for j := range c.RangeSets[i] {
			if l := rangeLine(&c.RangeSets[i][j]); !known[l] {
				add = append(add, l)
				known[l] = true
			}
		}
	}
	if len(add) == 0 {
		return nil
	}
	unlock, err := lockDir(filepath.Dir(s.dir))
	if err != nil {
		return stateError("stateDir", err)
	}
	defer unlock()
	ce, err := sharedRange(c, s.Network)
	if err != nil {
		return stateError("stateDir", err)
	}
	if ce != nil {
		return ce.CNI()
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(have, strings.Join(add, "\n")+"\n"...), 0o600); err != nil {
		return stateError("stateDir", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return stateError("stateDir", err)
	}
	return nil
}

// lockDir takes an exclusive flock on dir until unlock.
func lockDir(dir string) (unlock func(), err error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", dir, err)
	}
	return func() { f.Close() }, nil
}

// span is a range of this network's configuration (key set) or of another
// network's record (network set).
type span struct {
	r            *Range
	key, network string
}

func (p *span) String() string { return fmt.Sprintf("%s (%s)", p.r, &p.r.Subnet) }

// sharedRange is the configuration error of the first range of c that
// overlaps a range another network than self records; nil when none does.
func sharedRange(c *Config, self string) (*config.Error, error) {
	theirs, err := recordedRanges(c.StateDir, self)
	if err != nil || len(theirs) == 0 {
		return nil, err
	}
	var mine []span
	for i := range c.RangeSets {
		for j := range c.RangeSets[i] {
			mine = append(mine, span{r: &c.RangeSets[i][j], key: c.rangeKey(i, j)})
		}
	}
	a, b := firstOverlap(mine, theirs)
	if a == nil {
		return nil, nil
	}
	return config.Invalid(a.key, "range %s of network %q overlaps range %s of network %q, which holds addresses on this node: two networks of a node cannot share addresses (each hands them out on its own); give each network ranges of its own",
		a, self, b, b.network), nil
}

// recordedRanges reads the ranges every network but self records.
func recordedRanges(stateDir, self string) ([]span, error) {
	nets, err := networkDirs(stateDir)
	if err != nil {
		return nil, err
	}
	var out []span
	for _, network := range nets {
		if network == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join(stateDir, "ipam", network, rangesFile))
		if err != nil {
			continue // none recorded, or forgotten meanwhile
		}
		for _, l := range strings.Split(string(b), "\n") {
			if r := parseRangeLine(l); r != nil {
				out = append(out, span{r: r, network: network})
			}
		}
	}
	return out, nil
}

func parseRangeLine(l string) *Range {
	f := strings.Fields(l)
	if len(f) != 3 {
		return nil
	}
	start, end := canonicalIP(net.ParseIP(f[0])), canonicalIP(net.ParseIP(f[1]))
	_, subnet, err := net.ParseCIDR(f[2])
	if start == nil || end == nil || err != nil || len(start) != len(end) {
		return nil
	}
	return &Range{Subnet: *subnet, Start: start, End: end}
}

// firstOverlap finds a range of mine and one of theirs that share an
// address: sorted by first address, a range overlaps one of the other side
// that starts before it exactly when the latest end among those reaches
// its start. O(n log n), as checkOverlaps: a network may have 65,536.
func firstOverlap(mine, theirs []span) (*span, *span) {
	all := make([]*span, 0, len(mine)+len(theirs))
	for i := range mine {
		all = append(all, &mine[i])
	}
	for i := range theirs {
		all = append(all, &theirs[i])
	}
	sort.Slice(all, func(x, y int) bool {
		a, b := all[x].r.Start, all[y].r.Start
		if len(a) != len(b) {
			return len(a) < len(b)
		}
		return bytes.Compare(a, b) < 0
	})
	var reach [2]*span // of mine, of theirs: the one ending last so far
	for _, cur := range all {
		side := 0
		if cur.network != "" {
			side = 1
		}
		if o := reach[1-side]; o != nil && len(o.r.Start) == len(cur.r.Start) && bytes.Compare(cur.r.Start, o.r.End) <= 0 {
			if side == 0 {
				return cur, o
			}
			return o, cur
		}
		if r := reach[side]; r == nil || len(r.r.Start) != len(cur.r.Start) || bytes.Compare(cur.r.End, r.r.End) > 0 {
			reach[side] = cur
		}
	}
	return nil, nil
}
