package rtnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Filtered dumps: what a call asks about the node grows with its pods
// (each adds a route and link-local addresses on its host veth), and
// vishvananda/netlink asks the kernel for every route or address, parses
// every message into a struct and only then filters. Beside 110 pods an
// IPv6 route dump took 670-730 µs that way, for the one default route.
// Here the socket says NETLINK_GET_STRICT_CHK (Linux 4.20), so the kernel
// itself keeps to the main table or to one device, and only the headers
// of what is left are read before the few wanted messages are parsed:
// 150 µs for the same answer. On a kernel without strict checking the same
// filters run here instead; the answers are the same.

// query is a raw rtnetlink socket for filtered dumps.
type query struct {
	fd     int
	strict bool // the kernel filters; else only this side does
	buf    []byte
}

var seq atomic.Uint32

// strictCheck asks for the kernel's filtering; tests turn it off to run
// the filters of this side alone, as on a kernel without it.
var strictCheck = true

func newQuery() (*query, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netlink bind: %w", err)
	}
	q := &query{fd: fd, buf: make([]byte, 64<<10)}
	q.strict = strictCheck && unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1) == nil
	return q, nil
}

func (q *query) close() { unix.Close(q.fd) }

// errInterrupted: the table changed while the kernel dumped it.
var errInterrupted = errors.New("dump interrupted")

// dump sends a dump request (header type typ, then body) and calls each
// with every answer's payload until the kernel says done.
func (q *query) dump(typ uint16, body []byte, each func(payload []byte) error) error {
	s := seq.Add(1)
	req := make([]byte, unix.SizeofNlMsghdr+len(body))
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], typ)
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	binary.NativeEndian.PutUint32(req[8:], s)
	copy(req[unix.SizeofNlMsghdr:], body)
	if err := unix.Sendto(q.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("netlink send: %w", err)
	}
	interrupted := false
	var failed error // each's first error: the rest of the dump is read, not parsed
	for {
		n, _, err := unix.Recvfrom(q.fd, q.buf, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return fmt.Errorf("netlink receive: %w", err)
		}
		b := q.buf[:n]
		for len(b) >= unix.SizeofNlMsghdr {
			l := int(binary.NativeEndian.Uint32(b[0:]))
			if l < unix.SizeofNlMsghdr || l > len(b) {
				return fmt.Errorf("netlink: malformed message (length %d of %d)", l, len(b))
			}
			mtyp := binary.NativeEndian.Uint16(b[4:])
			flags := binary.NativeEndian.Uint16(b[6:])
			mseq := binary.NativeEndian.Uint32(b[8:])
			payload := b[unix.SizeofNlMsghdr:l]
			if a := (l + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1); a < len(b) {
				b = b[a:]
			} else {
				b = nil
			}
			if mseq != s {
				continue // a late answer to an abandoned request
			}
			if flags&unix.NLM_F_DUMP_INTR != 0 {
				interrupted = true
			}
			switch mtyp {
			case unix.NLMSG_DONE, unix.NLMSG_ERROR:
				// Both end the dump; either may carry the kernel's error
				// (DONE: one met while dumping, e.g. a refused filter).
				if len(payload) >= 4 {
					if e := int32(binary.NativeEndian.Uint32(payload)); e < 0 {
						return fmt.Errorf("netlink dump: %w", unix.Errno(-e))
					}
				}
				if failed != nil {
					return failed
				}
				if interrupted {
					return errInterrupted
				}
				return nil
			}
			if failed == nil {
				failed = each(payload)
			}
		}
	}
}

// queryFor runs f on the span's query socket of the calling thread's
// network namespace (made on first use), or on a socket of its own
// outside a span; f is retried while the kernel reports the dump
// interrupted, and its last answer kept after maxAttempts, as dump does.
func queryFor(f func(q *query) error) error {
	q, done, err := spanQuery()
	if err != nil {
		return err
	}
	defer done()
	for range maxAttempts {
		err = f(q)
		if errors.Is(err, errInterrupted) {
			continue
		}
		if err != nil {
			// The socket may hold the rest of a dump it could not read
			// (a malformed answer): the span makes a new one if asked again.
			dropQuery(q)
		}
		return err
	}
	return nil
}

// dropQuery closes q if it is a span's and forgets it.
func dropQuery(q *query) {
	mu.Lock()
	defer mu.Unlock()
	for k, x := range queries {
		if x == q {
			x.close()
			delete(queries, k)
		}
	}
}

// spanQuery returns the query socket for the calling thread's namespace
// and what to call when done with it (closing it outside a span).
func spanQuery() (*query, func(), error) {
	mu.Lock()
	defer mu.Unlock()
	if active > 0 {
		if ino, ok := threadNetNS(); ok {
			if q, ok := queries[ino]; ok {
				return q, func() {}, nil
			}
			q, err := newQuery()
			if err != nil {
				return nil, nil, err
			}
			queries[ino] = q
			return q, func() {}, nil
		}
	}
	q, err := newQuery()
	if err != nil {
		return nil, nil, err
	}
	return q, q.close, nil
}

// Route is what DefaultRoutes tells of a default route.
type Route struct {
	Family int    // unix.AF_INET or AF_INET6
	Type   uint8  // unix.RTN_UNICAST, RTN_BLACKHOLE, ...
	Links  []int  // the ifindexes of its next hops, in order; none for a route without a device
	Gw     net.IP // the first next hop's gateway, nil when on-link
}

// DefaultRoutes lists the default routes (prefix length 0) of family
// (unix.AF_INET or AF_INET6) in the main table of the calling thread's
// network namespace, as netlink's RouteList(nil, family) would find them,
// without cloned routes.
//
// Within a span one dump of both families answers every ask in a
// namespace: an ADD asks three times (the pod's MTU, the uplinks of
// masquerade, each family), and nothing a call does changes a default
// route.
func DefaultRoutes(family int) ([]Route, error) {
	all, err := spanDefaults()
	if err != nil {
		return nil, fmt.Errorf("listing default routes: %w", err)
	}
	var out []Route
	for _, r := range all {
		if r.Family == family {
			out = append(out, r)
		}
	}
	return out, nil
}

// spanDefaults is every default route of the main table, of both
// families: kept for the span in the calling thread's namespace, dumped
// anew outside a span.
func spanDefaults() ([]Route, error) {
	mu.Lock()
	ino, cached := uint64(0), false
	var rs []Route
	if active > 0 {
		if ino, cached = threadNetNS(); cached {
			rs, cached = defaults[ino]
		}
	}
	mu.Unlock()
	if cached {
		return rs, nil
	}
	rs, err := dumpDefaults()
	if err != nil {
		return nil, err
	}
	mu.Lock()
	if active > 0 && ino != 0 {
		defaults[ino] = rs
	}
	mu.Unlock()
	return rs, nil
}

// dumpDefaults dumps the default routes of both families (AF_UNSPEC: the
// kernel dumps each family's tables in turn, with the same filter).
func dumpDefaults() ([]Route, error) {
	var out []Route
	body := make([]byte, unix.SizeofRtMsg)
	body[0] = unix.AF_UNSPEC
	body[4] = unix.RT_TABLE_MAIN // rtm_table: the kernel's filter under strict checking
	err := queryFor(func(q *query) error {
		out = out[:0]
		return q.dump(unix.RTM_GETROUTE, body, func(p []byte) error {
			if len(p) < unix.SizeofRtMsg {
				return nil
			}
			rt := (*unix.RtMsg)(unsafe.Pointer(&p[0]))
			family := int(rt.Family)
			if (family != unix.AF_INET && family != unix.AF_INET6) || rt.Dst_len != 0 || rt.Flags&unix.RTM_F_CLONED != 0 {
				return nil
			}
			r := Route{Family: family, Type: rt.Type}
			table := uint32(rt.Table)
			err := eachAttr(p[unix.SizeofRtMsg:], func(typ uint16, v []byte) {
				switch typ {
				case unix.RTA_TABLE:
					if len(v) >= 4 {
						table = binary.NativeEndian.Uint32(v)
					}
				case unix.RTA_OIF:
					if len(v) >= 4 {
						r.Links = append(r.Links, int(binary.NativeEndian.Uint32(v)))
					}
				case unix.RTA_GATEWAY:
					r.Gw = append(net.IP(nil), v...)
				case unix.RTA_MULTIPATH:
					r.Links = append(r.Links, nexthops(v, &r.Gw)...)
				}
			})
			if err != nil {
				return err
			}
			if table == unix.RT_TABLE_MAIN {
				out = append(out, r)
			}
			return nil
		})
	})
	return out, err
}

// nexthops reads RTA_MULTIPATH: struct rtnexthop entries, each followed by
// its own attributes. gw gets the first gateway if it has none yet.
func nexthops(b []byte, gw *net.IP) []int {
	var out []int
	for len(b) >= unix.SizeofRtNexthop {
		l := int(binary.NativeEndian.Uint16(b[0:]))
		if l < unix.SizeofRtNexthop || l > len(b) {
			break
		}
		out = append(out, int(int32(binary.NativeEndian.Uint32(b[4:]))))
		_ = eachAttr(b[unix.SizeofRtNexthop:l], func(typ uint16, v []byte) {
			if typ == unix.RTA_GATEWAY && *gw == nil {
				*gw = append(net.IP(nil), v...)
			}
		})
		a := (l + unix.RTA_ALIGNTO - 1) &^ (unix.RTA_ALIGNTO - 1)
		if a >= len(b) {
			break
		}
		b = b[a:]
	}
	return out
}

// Addr is what LinkAddrs and GlobalAddrs tell of an address.
type Addr struct {
	Family    int // unix.AF_INET or AF_INET6
	IP        net.IP
	PrefixLen int
	Scope     uint8  // unix.RT_SCOPE_*
	Flags     uint32 // unix.IFA_F_*, the full 32 bits (IFA_FLAGS)
	LinkIndex int
}

// LinkAddrs lists the addresses of family (AF_UNSPEC: both) on the device
// ifindex in the calling thread's network namespace. netlink's AddrList(link, family)
// dumps every device's and filters here; the kernel filters this one.
func LinkAddrs(ifindex, family int) ([]Addr, error) {
	out, err := addrs(ifindex, family, nil)
	if err != nil {
		return nil, fmt.Errorf("listing addresses of ifindex %d: %w", ifindex, err)
	}
	return out, nil
}

// GlobalAddrs lists the addresses of scope global (RT_SCOPE_UNIVERSE) of
// family (AF_UNSPEC: both) on every device of the calling thread's network
// namespace: the node's own, without the link-local addresses every host
// veth has two of, which are skipped by their header alone.
func GlobalAddrs(family int) ([]Addr, error) {
	return Addrs(family, func(_ int, scope uint8) bool { return scope == unix.RT_SCOPE_UNIVERSE })
}

// Addrs lists the addresses of family (AF_UNSPEC: both) on every device of
// the calling thread's network namespace for which keep, given the
// family and scope of its header, holds; the others are skipped by that
// header alone, before their attributes are read.
func Addrs(family int, keep func(family int, scope uint8) bool) ([]Addr, error) {
	out, err := addrs(0, family, keep)
	if err != nil {
		return nil, fmt.Errorf("listing the node's addresses: %w", err)
	}
	return out, nil
}

// addrs dumps the addresses of family on ifindex (0: every device), only
// those keep holds for when it is not nil.
func addrs(ifindex, family int, keep func(family int, scope uint8) bool) ([]Addr, error) {
	var out []Addr
	body := make([]byte, unix.SizeofIfAddrmsg)
	body[0] = byte(family)
	binary.NativeEndian.PutUint32(body[4:], uint32(ifindex)) // ifa_index: the kernel's filter under strict checking
	err := queryFor(func(q *query) error {
		out = out[:0]
		return q.dump(unix.RTM_GETADDR, body, func(p []byte) error {
			if len(p) < unix.SizeofIfAddrmsg {
				return nil
			}
			m := (*unix.IfAddrmsg)(unsafe.Pointer(&p[0]))
			if (family != unix.AF_UNSPEC && int(m.Family) != family) || (ifindex != 0 && int(m.Index) != ifindex) ||
				(keep != nil && !keep(int(m.Family), m.Scope)) {
				return nil
			}
			a := Addr{Family: int(m.Family), PrefixLen: int(m.Prefixlen), Scope: m.Scope, Flags: uint32(m.Flags), LinkIndex: int(m.Index)}
			var local, address net.IP
			err := eachAttr(p[unix.SizeofIfAddrmsg:], func(typ uint16, v []byte) {
				switch typ {
				case unix.IFA_LOCAL:
					local = append(net.IP(nil), v...)
				case unix.IFA_ADDRESS:
					address = append(net.IP(nil), v...)
				case unix.IFA_FLAGS:
					if len(v) >= 4 {
						a.Flags = binary.NativeEndian.Uint32(v)
					}
				}
			})
			if err != nil {
				return err
			}
			// IFA_LOCAL is the device's own address; IFA_ADDRESS is the
			// peer's on a point-to-point link and the same otherwise
			// (IPv6 sends only IFA_ADDRESS).
			a.IP = local
			if a.IP == nil {
				a.IP = address
			}
			if a.IP != nil {
				out = append(out, a)
			}
			return nil
		})
	})
	return out, err
}

// eachAttr calls f with the type (without the nested and byte-order
// flags) and value of every rtattr in b.
func eachAttr(b []byte, f func(typ uint16, v []byte)) error {
	for len(b) >= unix.SizeofRtAttr {
		l := int(binary.NativeEndian.Uint16(b[0:]))
		if l < unix.SizeofRtAttr || l > len(b) {
			return fmt.Errorf("netlink: malformed attribute (length %d of %d)", l, len(b))
		}
		f(binary.NativeEndian.Uint16(b[2:])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER), b[unix.SizeofRtAttr:l])
		a := (l + unix.RTA_ALIGNTO - 1) &^ (unix.RTA_ALIGNTO - 1)
		if a >= len(b) {
			return nil
		}
		b = b[a:]
	}
	return nil
}
