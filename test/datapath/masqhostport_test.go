package datapath_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

// TestMasqueradeAvoidsHostPorts is the must-hold case of a masqueraded
// flow from a pod's port that another pod publishes as a hostPort: the
// masquerade gives the flow another port of the node, so the flow works
// and the world's clients of the published port still reach the pod that
// publishes it, even from the very address and port the flow talks to
// (which a translation to the published port would have sent to the
// wrong pod). IPv4 and IPv6, UDP and TCP.
func TestMasqueradeAvoidsHostPorts(t *testing.T) {
	e := newEnv(t)
	list := e.hostPortList("1.1.0", "", testutil.Cgroup(t), map[string]any{"ipMasq": true})
	a := e.addPod(list, "masq-client")
	// A port per family: the pod's TCP connection from the port leaves it
	// in TIME_WAIT.
	ports := map[bool]int{true: 7777, false: 7778}
	b := e.addPodWith(list, "publisher", mapping(7777, 7777, "tcp"), mapping(7777, 7777, "udp"),
		mapping(7778, 7778, "tcp"), mapping(7778, 7778, "udp"))
	for _, port := range ports {
		who, err := nettest.ServeWho(b.NS, "publisher", port)
		require.NoError(t, err)
		t.Cleanup(who.Close)
	}
	for _, fam := range []struct{ node, world net.IP }{{nettest.NodeIP4, nettest.WorldIP4}, {nettest.NodeIP6, nettest.WorldIP6}} {
		port := ports[fam.node.To4() != nil]
		t.Run(fam.world.String(), func(t *testing.T) { masqAvoidsHostPort(t, e, a.NS, fam.node, fam.world, port) })
	}
}

// masqAvoidsHostPort is one family of TestMasqueradeAvoidsHostPorts: pod
// podNS connects from port, which another pod publishes on node.
func masqAvoidsHostPort(t *testing.T, e *env, podNS ns.NetNS, node, world net.IP, port int) {
	fam := struct{ node, world net.IP }{node, world}
	{
		// The world's UDP peer on port 9000, driven by hand: it answers
		// the pod's flow, then talks to the published port from the same
		// address and port.
		var peer *net.UDPConn
		require.NoError(t, e.node.World.Do(func(ns.NetNS) error {
			var err error
			peer, err = net.ListenUDP("udp", &net.UDPAddr{IP: fam.world, Port: 9000})
			return err
		}))
		defer peer.Close()
		var client *net.UDPConn
		require.NoError(t, podNS.Do(func(ns.NetNS) error {
			var err error
			client, err = net.DialUDP("udp", &net.UDPAddr{Port: port}, &net.UDPAddr{IP: fam.world, Port: 9000})
			return err
		}))
		defer client.Close()

		_, err := client.Write([]byte("from the pod's published port\n"))
		require.NoError(t, err)
		buf := make([]byte, 256)
		_ = peer.SetReadDeadline(time.Now().Add(3 * time.Second))
		_, seen, err := peer.ReadFromUDP(buf)
		require.NoError(t, err, "the pod's datagram to %s", fam.world)
		require.True(t, seen.IP.Equal(fam.node), "masqueraded as the node: %s", seen)
		require.NotEqual(t, port, seen.Port, "the flow was given the published port %d", port)
		_, err = peer.WriteToUDP([]byte("reply\n"), seen)
		require.NoError(t, err)
		_ = client.SetReadDeadline(time.Now().Add(3 * time.Second))
		k, err := client.Read(buf)
		require.NoError(t, err, "the reply reaches the pod through the masquerade")
		require.Equal(t, "reply\n", string(buf[:k]))

		// The world, from the flow's remote address and port, to the
		// published port: the publishing pod answers and sees the client.
		_, err = peer.WriteToUDP([]byte("who\n"), &net.UDPAddr{IP: fam.node, Port: port})
		require.NoError(t, err)
		_ = peer.SetReadDeadline(time.Now().Add(3 * time.Second))
		k, from, err := peer.ReadFromUDP(buf)
		require.NoError(t, err, "the published port %s answers", hp(fam.node, port))
		require.True(t, from.IP.Equal(fam.node) && from.Port == port, "answered from %s", from)
		f := strings.Fields(string(buf[:k]))
		require.Len(t, f, 2, "%q", buf[:k])
		require.Equal(t, "publisher", f[0], "the published port reached another pod")
		require.Equal(t, hp(fam.world, 9000), f[1], "the publisher sees the world's client")

		// TCP: the pod's connection from the published port leaves from
		// another port; the world's connection to the port reaches the
		// publisher.
		srv := newServer(t, e.node.World, 0)
		c, err := dialFrom(podNS, port, fam.world, srv.port)
		require.NoError(t, err, "TCP from the pod's port %d to %s", port, fam.world)
		last := srv.last("tcp")
		require.Equal(t, addr(fam.node), last.Addr())
		require.NotEqual(t, uint16(port), last.Port(), "the connection was given the published port")
		w, err := nettest.AskWho(e.node.World, hp(fam.node, port), 0)
		require.NoError(t, err)
		require.Equal(t, "publisher", w.Name)
		require.True(t, w.SeenIP().Equal(fam.world), "the publisher sees %s", w.Seen)
		c.Close()
	}
}
