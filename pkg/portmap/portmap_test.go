package portmap

import (
	"errors"
	"github.com/ebpf-cni/ebpf-cni/pkg/cgroup"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/config"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

func TestValidate(t *testing.T) {
	cg := t.TempDir() // not cgroup2: only reached when mappings are valid
	for _, c := range []struct {
		key string
		m   Mapping
	}{
		{"runtimeConfig.portMappings[0].hostPort", Mapping{HostPort: 0, ContainerPort: 80}},
		{"runtimeConfig.portMappings[0].containerPort", Mapping{HostPort: 80, ContainerPort: 65536}},
		{"runtimeConfig.portMappings[0].protocol", Mapping{HostPort: 80, ContainerPort: 80, Protocol: "icmp"}},
		{"runtimeConfig.portMappings[0].hostIP", Mapping{HostPort: 80, ContainerPort: 80, HostIP: "224.0.0.1"}},
		{"runtimeConfig.portMappings[0].containerPort", Mapping{HostPort: 80, ContainerPort: 81, Protocol: "SCTP"}},
	} {
		_, err := Validate(Config{CgroupKeys: feature.CgroupKeys{CgroupPath: cg}}, []Mapping{c.m})
		var ce *config.Error
		require.ErrorAs(t, err, &ce, c.key)
		require.Equal(t, c.key, ce.Key)
	}
	// A second mapping of the same port, differently: refused; the same one
	// twice: merged.
	_, err := Validate(Config{CgroupKeys: feature.CgroupKeys{CgroupPath: cg}}, []Mapping{{HostPort: 80, ContainerPort: 80}, {HostPort: 80, ContainerPort: 81, Protocol: "TCP"}})
	var ce *config.Error
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "runtimeConfig.portMappings[1].hostPort", ce.Key)
	_, err = Validate(Config{CgroupKeys: feature.CgroupKeys{CgroupPath: cg}}, []Mapping{{HostPort: 80, ContainerPort: 80}, {HostPort: 80, ContainerPort: 80, Protocol: "tcp"}})
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "cgroupPath", ce.Key, "valid mappings, then the cgroup is checked")
	// The key's new name, named in its errors; it wins over the old one.
	_, err = Validate(Config{CgroupKeys: feature.CgroupKeys{SocketCgroupPath: "relative", CgroupPath: cg}}, []Mapping{{HostPort: 80, ContainerPort: 80}})
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "socketCgroupPath", ce.Key)
	var s *Settings
	if root, err := cgroup.V2Root(); err == nil {
		s, err = Validate(Config{CgroupKeys: feature.CgroupKeys{SocketCgroupPath: root, CgroupPath: "relative"}}, []Mapping{{HostPort: 80, ContainerPort: 80}})
		require.NoError(t, err)
		require.Equal(t, root, s.Cgroup)
	}
	// No mappings: no cgroup needed.
	s, err = Validate(Config{CgroupKeys: feature.CgroupKeys{CgroupPath: "relative"}}, nil)
	require.NoError(t, err)
	require.Empty(t, s.Mappings)
}

func TestPorts(t *testing.T) {
	s := &Settings{Mappings: []Mapping{
		{HostPort: 80, ContainerPort: 8080, Protocol: "tcp"},
		{HostPort: 53, ContainerPort: 53, Protocol: "udp", HostIP: "192.0.2.2"},
		{HostPort: 443, ContainerPort: 443, Protocol: "tcp", HostIP: "::"},
	}}
	ps, err := s.Ports([]net.IP{net.ParseIP("10.0.0.2"), net.ParseIP("fd00::2")})
	require.NoError(t, err)
	require.Equal(t, []HostPort{
		{Proto: "tcp", HostPort: 80, PodIP: "10.0.0.2", ContainerPort: 8080},
		{Proto: "tcp", HostPort: 80, PodIP: "fd00::2", ContainerPort: 8080},
		{Proto: "udp", HostIP: "192.0.2.2", HostPort: 53, PodIP: "10.0.0.2", ContainerPort: 53},
		{Proto: "tcp", HostPort: 443, PodIP: "fd00::2", ContainerPort: 443},
	}, ps)
	_, err = s.Ports([]net.IP{net.ParseIP("fd00::2")})
	var ce *config.Error
	require.ErrorAs(t, err, &ce, "an IPv4 hostIP for a pod without IPv4")
	require.Equal(t, "runtimeConfig.portMappings[1].hostIP", ce.Key)
}

func TestClaimRelease(t *testing.T) {
	owner := func(ip net.IP) string { return "pod " + ip.String() }
	a := HostPort{Proto: "tcp", HostPort: 80, PodIP: "10.0.0.2", ContainerPort: 8080}
	b := HostPort{Proto: "tcp", HostPort: 80, PodIP: "10.0.0.3", ContainerPort: 8080}
	var e maps.CniHostportEntry
	require.NoError(t, claim(&e, a, owner))
	require.True(t, published(&e, a))
	require.NoError(t, claim(&e, a, owner), "the same pod again (a retried ADD)")
	err := claim(&e, b, owner)
	require.True(t, errors.Is(err, ErrConflict))
	require.Contains(t, err.Error(), "pod 10.0.0.2")
	bOn := b
	bOn.HostIP = "192.0.2.2"
	require.ErrorIs(t, claim(&e, bOn, owner), ErrConflict, "one address clashes with every address")
	require.True(t, release(&e, a))
	require.Zero(t, e.N)

	// Specific addresses share a port, up to the limit.
	for i := range len(e.To) {
		p := b
		p.HostIP = net.IPv4(192, 0, 2, byte(i+1)).String()
		p.PodIP = net.IPv4(10, 0, 0, byte(i+2)).String()
		require.NoError(t, claim(&e, p, owner))
	}
	extra := b
	extra.HostIP = "192.0.2.99"
	require.ErrorIs(t, claim(&e, extra, owner), ErrConflict)
	require.ErrorIs(t, claim(&e, a, owner), ErrConflict, "every address clashes with one address")
	first := b
	first.HostIP, first.PodIP = "192.0.2.1", "10.0.0.2"
	require.False(t, release(&e, first))
	require.EqualValues(t, len(e.To)-1, e.N)
	require.False(t, published(&e, first))
}
