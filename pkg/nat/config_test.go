package nat

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/config"
	"github.com/ebpf-cni/ebpf-cni/pkg/conntrack"
)

func TestValidate(t *testing.T) {
	s, err := (&Config{IPMasq: true}).Validate()
	require.NoError(t, err)
	require.True(t, s.Enabled)
	require.Nil(t, s.Skip, "no nonMasqueradeCIDRs: the pod ranges apply")
	require.Equal(t, conntrack.DefaultTimeouts, s.Timeouts)

	s, err = (&Config{IPMasq: true, NonMasqueradeCIDRs: []string{"10.0.0.0/8", "fd00::/8"}, MasqueradeIP: "192.0.2.9",
		PortRange: "61000-62000", Timeouts: map[string]string{"udp": "30s", "tcpEstablished": "2h"}}).Validate()
	require.NoError(t, err)
	require.Len(t, s.Skip, 2)
	require.Equal(t, "192.0.2.9", s.MasqueradeIP.String())
	require.Equal(t, [2]uint16{61000, 62000}, [2]uint16{s.PortMin, s.PortMax})
	require.Equal(t, uint32(30), s.Timeouts.Udp)
	require.Equal(t, uint32(7200), s.Timeouts.TcpEstablished)
	require.Equal(t, conntrack.DefaultTimeouts.TcpClosing, s.Timeouts.TcpClosing)

	s, err = (&Config{NonMasqueradeCIDRs: []string{}}).Validate()
	require.NoError(t, err)
	require.NotNil(t, s.Skip, "an empty list masquerades everything, even the pod ranges")

	bad := map[string]Config{
		"nonMasqueradeCIDRs[0]": {NonMasqueradeCIDRs: []string{"10.0.0.0"}},
		"masqueradeIP":          {MasqueradeIP: "0.0.0.0"},
		"uplinks[1]":            {Uplinks: []string{"eth0", "a/b"}},
		"masqueradePortRange":   {PortRange: "100-200"},
		"natTimeouts.icmp":      {Timeouts: map[string]string{"icmp": "10ms"}},
		"natTimeouts.udpp":      {Timeouts: map[string]string{"udpp": "10s"}},
	}
	for key, c := range bad {
		_, err := c.Validate()
		var ce *config.Error
		require.True(t, errors.As(err, &ce), "%s: %v", key, err)
		require.Equal(t, key, ce.Key)
	}
	for _, r := range []string{"1-", "x-2000", "3000-2000", "2000"} {
		_, err := (&Config{PortRange: r}).Validate()
		require.Error(t, err, r)
	}
}

func TestPortRange(t *testing.T) {
	elo, ehi, err := ephemeralPorts()
	require.NoError(t, err)
	lo, hi, err := (&Settings{}).portRange()
	require.NoError(t, err)
	require.True(t, hi < elo || lo > ehi, "default %d-%d overlaps the ephemeral ports %d-%d", lo, hi, elo, ehi)
	require.GreaterOrEqual(t, int(hi)-int(lo), 1023)
	_, _, err = (&Settings{PortMin: elo, PortMax: elo}).portRange()
	var ce *config.Error
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "masqueradePortRange", ce.Key)
}
