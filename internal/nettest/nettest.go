// Package nettest builds the simulated node the integration tests and the
// demo run in: a "node" netns with an uplink veth to a "world" netns, pods
// as netns attached through the real plugin binaries with libcni, and the
// probes (ping, TCP) between them. Nothing here touches the machine's own
// interfaces: every device lives in a namespace made here.
package nettest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/utils/sysctl"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Addresses of the simulated uplink.
var (
	NodeIP4  = net.ParseIP("192.0.2.2")
	WorldIP4 = net.ParseIP("192.0.2.1")
	NodeIP6  = net.ParseIP("2001:db8:ffff::2")
	WorldIP6 = net.ParseIP("2001:db8:ffff::1")
)

// Node is a simulated node: its netns, the world beyond its uplink.
type Node struct {
	NS    ns.NetNS
	World ns.NetNS
}

// NewNode builds node and world namespaces joined by the uplink veth
// ("uplink" in the node, "wan" in the world), with addresses and a default
// route from the node to the world.
func NewNode() (*Node, error) {
	node, err := NewNetNS()
	if err != nil {
		return nil, err
	}
	world, err := NewNetNS()
	if err != nil {
		CloseNetNS(node)
		return nil, err
	}
	n := &Node{NS: node, World: world}
	if err := n.wire(); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

func (n *Node) wire() error {
	return n.NS.Do(func(ns.NetNS) error {
		attrs := netlink.NewLinkAttrs()
		attrs.Name = "uplink"
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "wan", PeerNamespace: netlink.NsFd(int(n.World.Fd()))}); err != nil {
			return fmt.Errorf("creating uplink: %w", err)
		}
		up, err := netlink.LinkByName("uplink")
		if err != nil {
			return err
		}
		if err := setup(up, NodeIP4, NodeIP6, WorldIP4, WorldIP6); err != nil {
			return err
		}
		return n.World.Do(func(ns.NetNS) error {
			wan, err := netlink.LinkByName("wan")
			if err != nil {
				return err
			}
			return setup(wan, WorldIP4, WorldIP6, nil, nil)
		})
	})
}

func setup(l netlink.Link, ip4, ip6, gw4, gw6 net.IP) error {
	// A real uplink has had its link-local address for long; without DAD
	// this one has it at once (neighbour solicitations for forwarded
	// packets take their source from it).
	if _, err := sysctl.Sysctl(fmt.Sprintf("net/ipv6/conf/%s/accept_dad", l.Attrs().Name), "0"); err != nil {
		return fmt.Errorf("disabling DAD on %s: %w", l.Attrs().Name, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return err
	}
	for _, a := range []*net.IPNet{{IP: ip4, Mask: net.CIDRMask(24, 32)}, {IP: ip6, Mask: net.CIDRMask(64, 128)}} {
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: a, Flags: unix.IFA_F_NODAD}); err != nil {
			return fmt.Errorf("adding %s: %w", a, err)
		}
	}
	for _, gw := range []net.IP{gw4, gw6} {
		if gw != nil {
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw}); err != nil {
				return fmt.Errorf("adding default route via %s: %w", gw, err)
			}
		}
	}
	return nil
}

// Close removes both namespaces (and with them every device in them).
func (n *Node) Close() {
	CloseNetNS(n.NS)
	CloseNetNS(n.World)
}

// Run runs a command inside netns n and returns its combined output.
func Run(n ns.NetNS, name string, args ...string) (string, error) {
	var out []byte
	err := n.Do(func(ns.NetNS) error {
		var err error
		out, err = exec.Command(name, args...).CombinedOutput()
		return err
	})
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Ping sends count echo requests from n to dst; an error unless all answered.
func Ping(n ns.NetNS, dst net.IP, count int) (string, error) {
	return Run(n, "ping", "-n", "-q", "-c", fmt.Sprint(count), "-i", "0.01", "-W", "2", dst.String())
}

// Listen opens a TCP echo server inside n; it echoes every line it gets.
// The socket belongs to n even though its goroutines do not.
func Listen(n ns.NetNS, ip net.IP) (net.Listener, error) {
	var l net.Listener
	err := n.Do(func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listening in %s: %w", n.Path(), err)
	}
	go serveEcho(l)
	return l, nil
}

func serveEcho(l net.Listener) {
	func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go EchoConn(c)
		}
	}()
}

// EchoConn writes back what it reads from c until c fails, then closes it.
func EchoConn(c net.Conn) {
	defer c.Close()
	buf := make([]byte, 64<<10)
	for {
		k, err := c.Read(buf)
		if err != nil {
			return
		}
		if _, err := c.Write(buf[:k]); err != nil {
			return
		}
	}
}

// Dial connects from inside n.
func Dial(n ns.NetNS, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func(ns.NetNS) error {
		var err error
		c, err = net.Dial("tcp", addr)
		return err
	})
	return c, err
}

// Echo sends msg over c and checks it comes back.
func Echo(c net.Conn, msg string) error {
	if _, err := c.Write([]byte(msg)); err != nil {
		return fmt.Errorf("writing: %w", err)
	}
	buf := make([]byte, len(msg))
	got := 0
	for got < len(msg) {
		k, err := c.Read(buf[got:])
		if err != nil {
			return fmt.Errorf("reading: %w", err)
		}
		got += k
	}
	if string(buf) != msg {
		return fmt.Errorf("echo got %q, want %q", buf, msg)
	}
	return nil
}

// TCP opens a connection from `from` to a server in `to`, exchanges a
// message, and closes both.
func TCP(from, to ns.NetNS, ip net.IP) error {
	l, err := Listen(to, ip)
	if err != nil {
		return err
	}
	defer l.Close()
	c, err := Dial(from, l.Addr().String())
	if err != nil {
		return fmt.Errorf("dialing %s: %w", l.Addr(), err)
	}
	defer c.Close()
	return Echo(c, "hello through ebpf-cni\n")
}

// CNI drives plugins the way a runtime does, from inside the node netns.
type CNI struct {
	Node   *Node
	Config *libcni.CNIConfig
}

// NewCNI uses the plugins in paths and keeps libcni's cache in cacheDir.
func NewCNI(node *Node, paths []string, cacheDir string) *CNI {
	return &CNI{Node: node, Config: libcni.NewCNIConfigWithCacheDir(paths, cacheDir, nil)}
}

func (c *CNI) in(f func() error) error {
	return c.Node.NS.Do(func(ns.NetNS) error { return f() })
}

// Add runs ADD of the list and returns the result in the current version.
func (c *CNI) Add(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) (*current.Result, error) {
	var res types.Result
	err := c.in(func() error {
		var err error
		res, err = c.Config.AddNetworkList(context.Background(), list, rt)
		return err
	})
	if err != nil {
		return nil, err
	}
	return current.NewResultFromResult(res)
}

// Check runs CHECK.
func (c *CNI) Check(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	return c.in(func() error { return c.Config.CheckNetworkList(context.Background(), list, rt) })
}

// Del runs DEL.
func (c *CNI) Del(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	return c.in(func() error { return c.Config.DelNetworkList(context.Background(), list, rt) })
}

// GC runs GC with the given valid attachments.
func (c *CNI) GC(list *libcni.NetworkConfigList, valid []types.GCAttachment) error {
	return c.in(func() error {
		return c.Config.GCNetworkList(context.Background(), list, &libcni.GCArgs{ValidAttachments: valid})
	})
}

// Status runs STATUS.
func (c *CNI) Status(list *libcni.NetworkConfigList) error {
	return c.in(func() error { return c.Config.GetStatusNetworkList(context.Background(), list) })
}

// Pod is a network namespace attached to a network.
type Pod struct {
	NS     ns.NetNS
	RT     *libcni.RuntimeConf
	Result *current.Result
}

// IP is the pod's first address of a family (4 or 6), or nil.
func (p *Pod) IP(family int) net.IP {
	for _, c := range p.Result.IPs {
		if (c.Address.IP.To4() != nil) == (family == 4) {
			return c.Address.IP
		}
	}
	return nil
}

// AddPod makes a netns and attaches it as containerID/eth0.
func (c *CNI) AddPod(list *libcni.NetworkConfigList, containerID string, caps map[string]any) (*Pod, error) {
	return c.AddPodArgs(list, containerID, caps, nil)
}

// AddPodArgs is AddPod with CNI_ARGS (K8S_POD_NAMESPACE... as a
// runtime passes them).
func (c *CNI) AddPodArgs(list *libcni.NetworkConfigList, containerID string, caps map[string]any, args [][2]string) (*Pod, error) {
	n, err := NewNetNS()
	if err != nil {
		return nil, err
	}
	rt := &libcni.RuntimeConf{ContainerID: containerID, NetNS: n.Path(), IfName: "eth0", CapabilityArgs: caps, Args: args}
	res, err := c.Add(list, rt)
	if err != nil {
		CloseNetNS(n)
		return nil, err
	}
	return &Pod{NS: n, RT: rt, Result: res}, nil
}

// DelPod detaches the pod and removes its netns.
func (c *CNI) DelPod(list *libcni.NetworkConfigList, p *Pod) error {
	err := c.Del(list, p.RT)
	CloseNetNS(p.NS)
	return err
}

// ListenPort is Listen on a given port.
func ListenPort(n ns.NetNS, ip net.IP, port int) (net.Listener, error) {
	var l net.Listener
	err := n.Do(func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp", net.JoinHostPort(ip.String(), fmt.Sprint(port)))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listening in %s: %w", n.Path(), err)
	}
	go serveEcho(l)
	return l, nil
}
