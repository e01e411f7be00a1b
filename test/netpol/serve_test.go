package netpol_test

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"slices"
	"sync"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
)

// serve starts the pod's servers, closed at cleanup: on every served port
// a TCP listener that accepts and closes, and a UDP socket that echoes;
// for SCTP, a raw socket per family that notes the INIT chunks it receives
// (see sctpInit).
func serve(t *testing.T, p *pod) {
	t.Helper()
	var closers []io.Closer
	t.Cleanup(func() {
		for _, c := range closers {
			c.Close()
		}
	})
	require.NoError(t, p.cni.NS.Do(func(ns.NetNS) error {
		for _, port := range servedPorts {
			l, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
			if err != nil {
				return err
			}
			closers = append(closers, l)
			go acceptAndClose(l)
			u, err := net.ListenPacket("udp", fmt.Sprintf(":%d", port))
			if err != nil {
				return err
			}
			closers = append(closers, u)
			go echo(u)
		}
		for _, network := range []string{"ip4:132", "ip6:132"} {
			r, err := net.ListenPacket(network, "")
			if err != nil {
				return fmt.Errorf("raw SCTP socket (%s): %w", network, err)
			}
			closers = append(closers, r)
			go receiveSCTP(r, p.String())
		}
		return nil
	}), "serving in %s", p)
}

func acceptAndClose(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		c.Close()
	}
}

func echo(u net.PacketConn) {
	buf := make([]byte, 512)
	for {
		k, from, err := u.ReadFrom(buf)
		if err != nil {
			return
		}
		_, _ = u.WriteTo(buf[:k], from)
	}
}

// SCTP: the kernels the tests run on may lack it (CONFIG_IP_SCTP is not
// set on the machine these tests were written on: socket(..., IPPROTO_SCTP)
// is EPROTONOSUPPORT), and an SCTP packet is decided by the datapath on its
// first packet like any other. So an SCTP probe is an INIT chunk sent
// through a raw IP socket, and reached means the destination pod's raw
// socket received it: the datapath let the association's first packet
// through in both the client's egress and the server's ingress. The reply
// direction of an allowed flow is what the TCP and UDP probes cover.

// sctpWaits are the SCTP probes under way, by the INIT's initiate tag.
var sctpWaits = struct {
	sync.Mutex
	m map[uint32]*sctpWait
}{m: map[uint32]*sctpWait{}}

type sctpWait struct {
	to   string // the destination pod
	port int
	once sync.Once
	done chan struct{}
}

// expectSCTP registers a probe of tag towards pod to, port; the returned
// function removes it.
func expectSCTP(tag uint32, to string, port int) (*sctpWait, func()) {
	w := &sctpWait{to: to, port: port, done: make(chan struct{})}
	sctpWaits.Lock()
	sctpWaits.m[tag] = w
	sctpWaits.Unlock()
	return w, func() {
		sctpWaits.Lock()
		delete(sctpWaits.m, tag)
		sctpWaits.Unlock()
	}
}

// receiveSCTP notes every INIT that reaches pod on a served port.
func receiveSCTP(r net.PacketConn, pod string) {
	buf := make([]byte, 2048)
	for {
		k, _, err := r.ReadFrom(buf) // Go strips the IPv4 header; IPv6 raw sockets get none
		if err != nil {
			return
		}
		b := buf[:k]
		if len(b) < 20 || b[12] != 1 { // common header (12) + an INIT chunk
			continue
		}
		port, tag := int(binary.BigEndian.Uint16(b[2:4])), binary.BigEndian.Uint32(b[16:20])
		sctpWaits.Lock()
		w := sctpWaits.m[tag]
		sctpWaits.Unlock()
		if w != nil && w.to == pod && w.port == port && slices.Contains(servedPorts, port) {
			w.once.Do(func() { close(w.done) })
		}
	}
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// sctpInit is an SCTP packet holding one INIT chunk (RFC 9260 3.3.2) from
// sport to dport with initiate tag tag, its CRC32c set.
func sctpInit(sport, dport uint16, tag uint32) []byte {
	b := make([]byte, 32)
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	// verification tag 0 (an INIT's), checksum last
	b[12] = 1                              // INIT
	binary.BigEndian.PutUint16(b[14:], 20) // chunk length
	binary.BigEndian.PutUint32(b[16:], tag)
	binary.BigEndian.PutUint32(b[20:], 65535) // a_rwnd
	binary.BigEndian.PutUint16(b[24:], 1)     // outbound streams
	binary.BigEndian.PutUint16(b[26:], 1)     // inbound streams
	binary.BigEndian.PutUint32(b[28:], tag)   // initial TSN
	binary.LittleEndian.PutUint32(b[8:], crc32.Checksum(b, castagnoli))
	return b
}
