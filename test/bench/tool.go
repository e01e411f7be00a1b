package main

// The project's own load generator, for what Debian's tools do not do: a
// 1-byte TCP request/response (sockperf's smallest message is 14 bytes) and
// a connect-request-response-close rate. The bench re-executes its own
// binary with toolEnv set, inside the client's or server's namespace,
// pinned with taskset. Sockets are driven by blocking system calls on raw
// descriptors, as a C client would, so Go's netpoller is not measured.

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const toolEnv = "EBPF_CNI_BENCH_TOOL"

// toolResult is what a client prints on stdout.
type toolResult struct {
	Count int     `json:"count"`
	Secs  float64 `json:"secs"`
	P50us float64 `json:"p50_us"`
	P99us float64 `json:"p99_us"`
}

func (r toolResult) perSec() float64 { return float64(r.Count) / r.Secs }

// toolMain runs the load generator when this binary was started as one
// ("server ADDR", "rr ADDR DURATION", "crr ADDR DURATION") and exits; it
// returns at once otherwise.
func toolMain() {
	spec := os.Getenv(toolEnv)
	if spec == "" {
		return
	}
	f := strings.Fields(spec)
	var err error
	switch {
	case len(f) == 2 && f[0] == "server":
		err = serve(f[1])
	case len(f) == 3 && (f[0] == "rr" || f[0] == "crr"):
		var d time.Duration
		if d, err = time.ParseDuration(f[2]); err == nil {
			var r toolResult
			if f[0] == "rr" {
				r, err = clientRR(f[1], d)
			} else {
				r, err = clientCRR(f[1], d)
			}
			if err == nil {
				err = json.NewEncoder(os.Stdout).Encode(r)
			}
		}
	default:
		err = fmt.Errorf("bad %s=%q", toolEnv, spec)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench tool:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func sockaddr(addr string) (*unix.SockaddrInet4, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, fmt.Errorf("port of %q: %w", addr, err)
	}
	ip := net.ParseIP(host).To4()
	if ip == nil {
		return nil, fmt.Errorf("%q is not an IPv4 address", host)
	}
	sa := &unix.SockaddrInet4{Port: p}
	copy(sa.Addr[:], ip)
	return sa, nil
}

// socket makes a TCP socket with Nagle off and 5 s timeouts, so a broken
// path fails a run instead of hanging it.
func socket() (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	tv := unix.Timeval{Sec: 5}
	for _, opt := range []int{unix.SO_SNDTIMEO, unix.SO_RCVTIMEO} {
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, opt, &tv); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("setsockopt: %w", err)
		}
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("setsockopt: %w", err)
	}
	return fd, nil
}

// serve echoes every byte on every connection until the peer closes, one
// connection at a time on one thread: the clients are sequential, and a
// goroutine per connection would wait for the Go scheduler to take the P
// back from the thread blocked in accept (milliseconds with GOMAXPROCS=1).
func serve(addr string) error {
	sa, err := sockaddr(addr)
	if err != nil {
		return err
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		return err
	}
	if err := unix.Bind(fd, sa); err != nil {
		return fmt.Errorf("bind %s: %w", addr, err)
	}
	if err := unix.Listen(fd, 4096); err != nil {
		return err
	}
	for {
		c, _, err := unix.Accept4(fd, unix.SOCK_CLOEXEC)
		if err != nil {
			if err == unix.EINTR || err == unix.ECONNABORTED {
				continue
			}
			return fmt.Errorf("accept: %w", err)
		}
		_ = unix.SetsockoptInt(c, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		echo(c)
	}
}

func echo(fd int) {
	defer unix.Close(fd)
	buf := make([]byte, 64)
	for {
		n, err := unix.Read(fd, buf)
		if n <= 0 || err != nil {
			return
		}
		if _, err := unix.Write(fd, buf[:n]); err != nil {
			return
		}
	}
}

func connect(sa unix.Sockaddr) (int, error) {
	fd, err := socket()
	if err != nil {
		return -1, err
	}
	for {
		err = unix.Connect(fd, sa)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("connect: %w", err)
	}
	return fd, nil
}

// transact writes one byte and reads it back.
func transact(fd int, buf []byte) error {
	if _, err := unix.Write(fd, buf); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	for {
		n, err := unix.Read(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("read: %w", err)
		}
		if n != 1 {
			return fmt.Errorf("read: connection closed")
		}
		return nil
	}
}

// clientRR runs 1-byte ping-pong over one connection for d.
func clientRR(addr string, d time.Duration) (toolResult, error) {
	sa, err := sockaddr(addr)
	if err != nil {
		return toolResult{}, err
	}
	fd, err := connect(sa)
	if err != nil {
		return toolResult{}, err
	}
	defer unix.Close(fd)
	buf := []byte{1}
	// Warm the path (neighbour entries, caches) before the clock starts.
	for range 100 {
		if err := transact(fd, buf); err != nil {
			return toolResult{}, err
		}
	}
	return timed(d, func() error { return transact(fd, buf) })
}

// clientCRR opens a connection, exchanges one byte and closes it, for d.
func clientCRR(addr string, d time.Duration) (toolResult, error) {
	sa, err := sockaddr(addr)
	if err != nil {
		return toolResult{}, err
	}
	buf := []byte{1}
	one := func() error {
		fd, err := connect(sa)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return transact(fd, buf)
	}
	for range 10 {
		if err := one(); err != nil {
			return toolResult{}, err
		}
	}
	return timed(d, one)
}

// timed runs op back to back for d and summarises the latencies of the runs.
func timed(d time.Duration, op func() error) (toolResult, error) {
	lat := make([]float64, 0, 1<<18)
	start := time.Now()
	end := start.Add(d)
	for {
		t0 := time.Now()
		if t0.After(end) {
			break
		}
		if err := op(); err != nil {
			return toolResult{}, fmt.Errorf("after %d operations: %w", len(lat), err)
		}
		lat = append(lat, float64(time.Since(t0).Nanoseconds())/1e3)
	}
	return summarizeLat(lat, time.Since(start)), nil
}

func summarizeLat(lat []float64, elapsed time.Duration) toolResult {
	return toolResult{Count: len(lat), Secs: elapsed.Seconds(), P50us: percentile(lat, .50), P99us: percentile(lat, .99)}
}
