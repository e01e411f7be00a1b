package nettest

import (
	"bufio"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// WhoServer answers who it is and who it sees, over TCP and UDP on one
// port: a TCP connection gets "<name> <client address:port>\n" and then its
// bytes echoed; a datagram gets the same line back. Tests learn from it
// which backend a Service chose and with which source address a packet
// arrived (masqueraded or not).
type WhoServer struct {
	Name string
	Port int
	tcp  net.Listener
	udp  net.PacketConn
}

// ServeWho starts a WhoServer in n on port (0: a free one) of every
// address.
func ServeWho(n ns.NetNS, name string, port int) (*WhoServer, error) {
	s := &WhoServer{Name: name}
	err := n.Do(func(ns.NetNS) error {
		var err error
		if s.tcp, err = net.Listen("tcp", fmt.Sprintf(":%d", port)); err != nil {
			return err
		}
		s.Port = s.tcp.Addr().(*net.TCPAddr).Port
		s.udp, err = net.ListenPacket("udp", fmt.Sprintf(":%d", s.Port))
		return err
	})
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("serving in %s: %w", n.Path(), err)
	}
	go func() {
		for {
			c, err := s.tcp.Accept()
			if err != nil {
				return
			}
			go func() {
				if _, err := fmt.Fprintf(c, "%s %s\n", s.Name, unmapped(c.RemoteAddr())); err != nil {
					c.Close()
					return
				}
				EchoConn(c)
			}()
		}
	}()
	go func() {
		buf := make([]byte, 2048)
		for {
			_, from, err := s.udp.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = s.udp.WriteTo([]byte(fmt.Sprintf("%s %s\n", s.Name, unmapped(from))), from)
		}
	}()
	return s, nil
}

func unmapped(a net.Addr) string {
	switch v := a.(type) {
	case *net.TCPAddr:
		ap := v.AddrPort()
		return net.JoinHostPort(ap.Addr().Unmap().String(), strconv.Itoa(int(ap.Port())))
	case *net.UDPAddr:
		ap := v.AddrPort()
		return net.JoinHostPort(ap.Addr().Unmap().String(), strconv.Itoa(int(ap.Port())))
	}
	return a.String()
}

// Close stops the server.
func (s *WhoServer) Close() {
	if s.tcp != nil {
		s.tcp.Close()
	}
	if s.udp != nil {
		s.udp.Close()
	}
}

// Who is what a WhoServer said: its name, and the client address it saw.
type Who struct {
	Name string
	Seen string // ip:port as the server saw the client
}

// SeenIP is the client address the server saw.
func (w Who) SeenIP() net.IP {
	h, _, _ := net.SplitHostPort(w.Seen)
	return net.ParseIP(h)
}

// SeenPort is the client port the server saw.
func (w Who) SeenPort() int {
	_, p, _ := net.SplitHostPort(w.Seen)
	v, _ := strconv.Atoi(p)
	return v
}

func parseWho(line string) (Who, error) {
	f := strings.Fields(line)
	if len(f) != 2 {
		return Who{}, fmt.Errorf("unexpected answer %q", line)
	}
	return Who{Name: f[0], Seen: f[1]}, nil
}

// AskWho connects from n to addr over TCP (from local port lport unless 0),
// reads who answered, checks an echo through the connection and closes it.
func AskWho(n ns.NetNS, addr string, lport int) (Who, error) {
	var c net.Conn
	err := n.Do(func(ns.NetNS) error {
		d := net.Dialer{Timeout: 3 * time.Second, LocalAddr: &net.TCPAddr{Port: lport}}
		var err error
		c, err = d.Dial("tcp", addr)
		return err
	})
	if err != nil {
		return Who{}, fmt.Errorf("dialing %s: %w", addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return Who{}, fmt.Errorf("reading from %s: %w", addr, err)
	}
	w, err := parseWho(line)
	if err != nil {
		return w, err
	}
	// Many segments each way: a flow that conntrack saw in one direction
	// only would meet kube-proxy's INVALID drop here.
	for i := 0; i < 3; i++ {
		msg := strings.Repeat(fmt.Sprintf("round %d ", i), 2000) + "\n"
		if _, err := c.Write([]byte(msg)); err != nil {
			return w, fmt.Errorf("writing to %s: %w", addr, err)
		}
		got, err := r.ReadString('\n')
		if err != nil || got != msg {
			return w, fmt.Errorf("echo from %s: %v (%d of %d bytes)", addr, err, len(got), len(msg))
		}
	}
	return w, nil
}

// AskWhoUDP sends a datagram from n to addr and reads who answered.
func AskWhoUDP(n ns.NetNS, addr string) (Who, error) {
	var w Who
	err := n.Do(func(ns.NetNS) error {
		c, err := net.Dial("udp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 512)
		for try := 0; try < 3; try++ {
			if _, err := c.Write([]byte("who?")); err != nil {
				return err
			}
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			k, err := c.Read(buf)
			if err == nil {
				w, err = parseWho(string(buf[:k]))
				return err
			}
		}
		return fmt.Errorf("no UDP answer from %s", addr)
	})
	return w, err
}
