package netpol_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
)

// Probe timeouts: a denied probe waits out probeTimeout (the datapath drops
// denied packets silently); an expected connection that did not come within
// it is probed again with retryTimeout before it counts as denied, so a
// loaded machine does not fail a cell.
const (
	probeTimeout = 300 * time.Millisecond
	retryTimeout = time.Second
	// concurrency bounds the probes under way at once.
	concurrency = 48
)

var families = []int{4, 6}

// key is one matrix: a protocol, a port and an address family.
type key struct {
	proto corev1.Protocol
	port  int
	fam   int
}

func (k key) String() string { return fmt.Sprintf("%s/%d IPv%d", k.proto, k.port, k.fam) }

// result is what one probe saw.
type result struct {
	ok  bool
	why string // why not: timeout, refused...
}

// probe connects from one pod to another: TCP connects, UDP gets its
// datagram echoed, SCTP's INIT reaches the server (see sctpInit).
func probe(from, to *pod, k key, timeout time.Duration) result {
	addr := net.JoinHostPort(to.ip(k.fam).String(), strconv.Itoa(k.port))
	switch k.proto {
	case corev1.ProtocolTCP:
		var c net.Conn
		err := from.cni.NS.Do(func(ns.NetNS) error {
			var err error
			c, err = (&net.Dialer{Timeout: timeout}).Dial("tcp", addr)
			return err
		})
		if err != nil {
			return result{why: why(err)}
		}
		c.Close()
		return result{ok: true}
	case corev1.ProtocolUDP:
		return probeUDP(from, addr, timeout)
	case corev1.ProtocolSCTP:
		return probeSCTP(from, to, k, timeout)
	}
	return result{why: "unknown protocol " + string(k.proto)}
}

// probeUDP sends a datagram and waits for its echo; once more half-way, in
// case the first waited for a neighbour.
func probeUDP(from *pod, addr string, timeout time.Duration) result {
	var c net.Conn
	if err := from.cni.NS.Do(func(ns.NetNS) error {
		var err error
		c, err = net.Dial("udp", addr)
		return err
	}); err != nil {
		return result{why: why(err)}
	}
	defer c.Close()
	msg := []byte(fmt.Sprintf("probe %d", rand.Uint64()))
	buf := make([]byte, 512)
	end := time.Now().Add(timeout)
	var err error
	for try := 0; try < 2; try++ {
		if _, err = c.Write(msg); err != nil {
			break
		}
		dl := end
		if try == 0 {
			dl = time.Now().Add(timeout / 2)
		}
		_ = c.SetReadDeadline(dl)
		var k int
		if k, err = c.Read(buf); err == nil {
			if string(buf[:k]) == string(msg) {
				return result{ok: true}
			}
			return result{why: fmt.Sprintf("echo %q", buf[:k])}
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
	}
	return result{why: why(err)}
}

func probeSCTP(from, to *pod, k key, timeout time.Duration) result {
	tag := rand.Uint32() | 1
	w, done := expectSCTP(tag, to.String(), k.port)
	defer done()
	var c net.Conn
	if err := from.cni.NS.Do(func(ns.NetNS) error {
		var err error
		c, err = net.Dial(fmt.Sprintf("ip%d:132", k.fam), to.ip(k.fam).String())
		return err
	}); err != nil {
		return result{why: why(err)}
	}
	defer c.Close()
	pkt := sctpInit(uint16(1024+tag%60000), uint16(k.port), tag)
	for try := 0; try < 2; try++ {
		if _, err := c.Write(pkt); err != nil {
			return result{why: why(err)}
		}
		select {
		case <-w.done:
			return result{ok: true}
		case <-time.After(timeout / 2):
		}
	}
	return result{why: "timeout"}
}

// why names a failed probe's error briefly.
func why(err error) string {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "unreachable"
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EACCES):
		return "not permitted"
	}
	return err.Error()
}

// cell is one probe of a matrix: from row to column.
type cell struct {
	from, to int
	k        key
}

// probeCells runs the probes of cells, concurrency at a time; timeout
// gives each its own.
func (cl *cluster) probeCells(cells []cell, timeout func(cell) time.Duration) []result {
	out := make([]result, len(cells))
	parallel(len(cells), func(i int) {
		c := cells[i]
		out[i] = probe(cl.pods[c.from], cl.pods[c.to], c.k, timeout(c))
	})
	return out
}

// parallel runs f(0)...f(n-1), concurrency at a time, and waits for them.
func parallel(n int, f func(i int)) {
	sem := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			f(i)
		}()
	}
	wg.Wait()
}

// npods is the size of the model: 3 namespaces of 3 pods.
const npods = 9

// reach is an expected matrix: reach[from][to]. A pod reaching itself goes
// through its own loopback and meets no policy anywhere (upstream's model
// leaves loopback out of its verdicts for that reason); its cells are
// expected reachable whatever a case says.
type reach [npods][npods]bool

// allowAll is the matrix of a cluster without policies.
func allowAll() *reach {
	r := &reach{}
	for i := range r {
		for j := range r[i] {
			r[i][j] = true
		}
	}
	return r
}

// denyAll is the matrix where nothing but loopback is reachable.
func denyAll() *reach { return &reach{} }

// set expects from -> to to be reachable or not; from and to are pods
// ("x/a"), a namespace's pods ("x/*"), a name in every namespace ("*/a")
// or everyone ("*").
func (r *reach) set(from, to string, v bool) *reach {
	for i := range npods {
		for j := range npods {
			if matches(from, i) && matches(to, j) {
				r[i][j] = v
			}
		}
	}
	return r
}

func (r *reach) deny(from, to string) *reach  { return r.set(from, to, false) }
func (r *reach) allow(from, to string) *reach { return r.set(from, to, true) }

// want is the expected value of from -> to, loopback reachable.
func (r *reach) want(from, to int) bool { return from == to || r[from][to] }

// modelName is the name of row or column i: x/a, x/b... z/c.
func modelName(i int) string { return namespaces[i/3] + "/" + podNames[i%3] }

func matches(pattern string, i int) bool {
	ns, name, _ := strings.Cut(modelName(i), "/")
	pns, pname, ok := strings.Cut(pattern, "/")
	if pattern == "*" {
		return true
	}
	if !ok {
		panic("bad pod pattern " + pattern)
	}
	return (pns == "*" || pns == ns) && (pname == "*" || pname == name)
}

// check is what a case probes: a protocol and a port, and the matrix
// expected there over IPv4 (want) and IPv6 (want6; nil: as IPv4).
type check struct {
	proto corev1.Protocol
	port  int
	want  *reach
	want6 *reach
}

func tcp(port int, want *reach) check {
	return check{proto: corev1.ProtocolTCP, port: port, want: want}
}
func udp(port int, want *reach) check {
	return check{proto: corev1.ProtocolUDP, port: port, want: want}
}
func sctp(port int, want *reach) check {
	return check{proto: corev1.ProtocolSCTP, port: port, want: want}
}

// dual is a check whose IPv6 matrix differs from its IPv4 one.
func (c check) dual(want6 *reach) check { c.want6 = want6; return c }

func (c check) table(fam int) *reach {
	if fam == 6 && c.want6 != nil {
		return c.want6
	}
	return c.want
}

// expected is the expected value of a cell under checks.
func expected(checks []check, c cell) bool {
	for _, ch := range checks {
		if ch.proto == c.k.proto && ch.port == c.k.port {
			return ch.table(c.k.fam).want(c.from, c.to)
		}
	}
	panic(fmt.Sprintf("no check for %s", c.k))
}

// cellsOf lists every cell of checks, both families.
func cellsOf(checks []check) []cell {
	var out []cell
	for _, ch := range checks {
		for _, fam := range families {
			for i := range npods {
				for j := range npods {
					out = append(out, cell{from: i, to: j, k: key{proto: ch.proto, port: ch.port, fam: fam}})
				}
			}
		}
	}
	return out
}

// expect asserts every cell of checks. The matrix may take a moment to
// hold after the API changed (the agent has to see the change and write
// the maps): the cells that do not hold yet are probed again until they do
// or within has passed; then every cell is probed once more, so that one
// that held before the agent acted and broke after is caught. It returns
// how long the matrix took to hold.
func (cl *cluster) expect(t testing.TB, checks []check, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	all := cellsOf(checks)
	pending := all
	var took time.Duration
	for len(pending) > 0 {
		res := cl.probeCells(pending, func(cell) time.Duration { return probeTimeout })
		var wrong []cell
		for i, c := range pending {
			if res[i].ok != expected(checks, c) {
				wrong = append(wrong, c)
			}
		}
		pending = wrong
		took = time.Since(start)
		if time.Since(start) > within {
			break
		}
		if len(pending) > 0 {
			time.Sleep(50 * time.Millisecond)
		}
	}
	res := cl.probeCells(all, func(cell) time.Duration { return probeTimeout })
	var again []int
	for i, c := range all {
		if !res[i].ok && expected(checks, c) {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		cells := make([]cell, len(again))
		for n, i := range again {
			cells[n] = all[i]
		}
		for n, r := range cl.probeCells(cells, func(cell) time.Duration { return retryTimeout }) {
			res[again[n]] = r
		}
	}
	if report := diff(checks, all, res); report != "" {
		t.Errorf("the reachability matrix does not hold (%s after the change; probes of %v):\n%s", took.Round(time.Millisecond), probeTimeout, report)
	}
	return took
}

// diff prints, for every matrix with a wrong cell, the observed matrix with
// the wrong cells marked, and each wrong cell with what its probe saw.
func diff(checks []check, cells []cell, res []result) string {
	type obs struct {
		ok    [npods][npods]bool
		why   [npods][npods]string
		wrong int
	}
	byKey := map[key]*obs{}
	var order []key
	for i, c := range cells {
		o := byKey[c.k]
		if o == nil {
			o = &obs{}
			byKey[c.k] = o
			order = append(order, c.k)
		}
		o.ok[c.from][c.to], o.why[c.from][c.to] = res[i].ok, res[i].why
		if res[i].ok != expected(checks, c) {
			o.wrong++
		}
	}
	var b strings.Builder
	for _, k := range order {
		o := byKey[k]
		if o.wrong == 0 {
			continue
		}
		fmt.Fprintf(&b, "%s: %d of %d cells wrong (rows from, columns to; . reached and expected, X denied and expected,\n"+
			"  ! reached but expected denied, ? denied but expected reached)\n     ", k, o.wrong, npods*npods)
		for j := range npods {
			fmt.Fprintf(&b, " %4s", modelName(j))
		}
		b.WriteString("\n")
		var cells []string
		for i := range npods {
			fmt.Fprintf(&b, "%4s ", modelName(i))
			for j := range npods {
				want := expected(checks, cell{from: i, to: j, k: k})
				mark := map[[2]bool]string{{true, true}: ".", {false, false}: "X", {true, false}: "!", {false, true}: "?"}[[2]bool{o.ok[i][j], want}]
				fmt.Fprintf(&b, " %4s", mark)
				if o.ok[i][j] != want {
					got := "reached"
					if !o.ok[i][j] {
						got = o.why[i][j]
					}
					cells = append(cells, fmt.Sprintf("%s -> %s: %s", modelName(i), modelName(j), got))
				}
			}
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "  %s\n", strings.Join(cells, "\n  "))
	}
	return b.String()
}
