package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
)

// whoami serves TCP on port inside n (every address of it): to each
// connection it writes "<name> saw <client address>" and closes it. It is
// what a server there sees of whoever reaches it.
func whoami(n ns.NetNS, port int, name string) (net.Listener, error) {
	var l net.Listener
	err := n.Do(func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp", ":"+strconv.Itoa(port))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listening on %d in %s: %w", port, name, err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s saw %s\n", name, c.RemoteAddr())
			c.Close()
		}
	}()
	return l, nil
}

// ask connects from inside n to addr and returns the line the server
// writes (whoami's "who saw what").
func ask(n ns.NetNS, addr string) (string, error) {
	var c net.Conn
	err := n.Do(func(ns.NetNS) error {
		var err error
		c, err = net.DialTimeout("tcp", addr, 3*time.Second)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("connecting to %s: %w", addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("reading from %s: %w", addr, err)
	}
	return strings.TrimSpace(line), nil
}

// sawHost is the client address in whoami's answer, without the port.
func sawHost(answer string) string {
	_, ap, _ := strings.Cut(answer, " saw ")
	h, _, err := net.SplitHostPort(ap)
	if err != nil {
		return ap
	}
	return h
}

var forwardPolicy = regexp.MustCompile(`Chain FORWARD \(policy \w+ (\d+) packets`)

// forwardPackets is the packet count of the FORWARD chain of n's iptables
// or ip6tables (ipt): its policy counter, every packet the chain saw, as it
// holds no rule.
func forwardPackets(n ns.NetNS, ipt string) (int, error) {
	out, err := nettest.Run(n, ipt, "-L", "FORWARD", "-n", "-v", "-x")
	if err != nil {
		return 0, err
	}
	m := forwardPolicy.FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("no FORWARD policy counter in: %s", out)
	}
	return strconv.Atoi(m[1])
}

// counters are the node-wide packet counters by reason, as the operator
// CLI reports them (`ebpf-cni counters -o json`: total.reasons).
type counters map[string]uint64

func parseCounters(js []byte) (counters, error) {
	var v struct {
		Total struct {
			Reasons map[string]struct {
				Packets uint64 `json:"packets"`
			} `json:"reasons"`
		} `json:"total"`
	}
	if err := json.Unmarshal(js, &v); err != nil {
		return nil, fmt.Errorf("decoding ebpf-cni counters -o json: %w", err)
	}
	out := counters{}
	for r, c := range v.Total.Reasons {
		out[r] = c.Packets
	}
	return out, nil
}

// since is what each named counter grew by from before.
func (c counters) since(before counters, names ...string) string {
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s +%d", n, c[n]-before[n]))
	}
	return strings.Join(parts, ", ")
}

// median of durations, in milliseconds.
func medianMS(ds []time.Duration) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return float64(m.Microseconds()) / 1000
}
