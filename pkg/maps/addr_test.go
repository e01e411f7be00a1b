package maps

import (
	"encoding/binary"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

func TestAddressRoundTrip(t *testing.T) {
	for _, s := range []string{"10.1.2.3", "::ffff:10.1.2.3", "fd00::7", "2001:db8::1"} {
		ip := net.ParseIP(s)
		back := IP(Family(ip), Addr16(ip))
		require.True(t, ip.Equal(back), s)
		if ip.To4() != nil {
			require.Len(t, back, 4, "IPv4 comes back as 4 bytes")
			require.Equal(t, uint8(4), EndpointKey(ip).Family)
		} else {
			require.Len(t, back, 16)
			require.Equal(t, uint8(6), EndpointKey(ip).Family)
		}
	}
	d := CniEndpointDev{N_ip4: 1, N_ip6: 1}
	d.Ip4[0] = binary.NativeEndian.Uint32(net.ParseIP("10.9.8.7").To4())
	d.Ip6[0] = Addr16(net.ParseIP("fd00::9"))
	require.Equal(t, "[10.9.8.7 fd00::9]", fmtIPs(EndpointIPs(&d)))
}

func fmtIPs(ips []net.IP) string {
	var s []string
	for _, ip := range ips {
		s = append(s, ip.String())
	}
	return "[" + strings.Join(s, " ") + "]"
}

// TestRegisterNetwork: one writer of ipam_nets; a name that does not fit is
// held as its digest by every caller alike, and a clash is refused.
func TestRegisterNetwork(t *testing.T) {
	root := testutil.BPFFS(t)
	m, err := OpenPinned(root, CniMapIpamNets)
	require.NoError(t, err)
	defer m[CniMapIpamNets].Close()
	nets := m[CniMapIpamNets]

	long := strings.Repeat("x", 130)
	for range 2 { // registering again is no clash
		id, err := RegisterNetwork(nets, long)
		require.NoError(t, err)
		require.Equal(t, NetID(long), id)
	}
	var v CniIpamNet
	require.NoError(t, nets.Lookup(NetID(long), &v))
	require.Equal(t, Fit(long, CniNetNameLen), GoString(v.Name[:]))
	require.True(t, strings.HasPrefix(GoString(v.Name[:]), "sha256:"))

	// Another name under the same ID: planted, since finding a real FNV
	// clash is beside the point.
	short := "short"
	CString(v.Name[:], "someone-else")
	require.NoError(t, nets.Put(NetID(short), &v))
	_, err = RegisterNetwork(nets, short)
	var clash *NetworkClash
	require.True(t, errors.As(err, &clash), "%v", err)
	require.Equal(t, "someone-else", clash.Other)
}
