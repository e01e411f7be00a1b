package feature

import (
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/config"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// Undo runs every step, last first, even past a failing one, and only once.
func TestUndo(t *testing.T) {
	var u Undo
	var order []int
	for i := range 3 {
		u.Push(func() error {
			order = append(order, i)
			if i == 1 {
				return errors.New("step 1 failed")
			}
			return nil
		})
	}
	require.EqualError(t, u.Run(), "step 1 failed")
	require.Equal(t, []int{2, 1, 0}, order)
	require.NoError(t, u.Run())
	require.Equal(t, []int{2, 1, 0}, order, "steps run once")
}

func TestLive(t *testing.T) {
	l := NewLive(map[string]*node.Record{
		"ec1": {HostIfName: "ec1", HostIfIndex: 7, Network: "net-a", IPs: []string{"10.0.0.2/24", "fd00::2/64"}},
	})
	require.False(t, l.Empty())
	require.True(t, l.IfIndex(7))
	require.False(t, l.IfIndex(8))
	require.True(t, l.IP(net.ParseIP("fd00::2")))
	require.False(t, l.IP(net.ParseIP("10.0.0.3")))
	require.True(t, l.Network(maps.NetID("net-a")))
	require.False(t, l.Network(maps.NetID("net-b")))
	require.True(t, l.Host("ec1"))
	// An endpoint kept without its record keeps every network.
	l = NewLive(map[string]*node.Record{"ec2": {HostIfName: "ec2"}})
	require.True(t, l.Network(maps.NetID("net-b")))
	require.True(t, NewLive(nil).Empty())
}

func TestSweep(t *testing.T) {
	removed := 0
	del := func() error { removed++; return nil }
	dry := &Sweep{DryRun: true}
	dry.Remove("a", del)
	found, err := dry.Result()
	require.NoError(t, err)
	require.Equal(t, []string{"a"}, found)
	require.Zero(t, removed)
	wet := &Sweep{}
	wet.Remove("a", del)
	wet.Remove("b", func() error { return errors.New("busy") })
	found, err = wet.Result()
	require.Equal(t, []string{"a", "b"}, found)
	require.EqualError(t, err, "busy")
	require.Equal(t, 1, removed)
}

// Fail: a bad key is code 7 naming it, a CNI error passes, anything else
// gets the feature's code.
func TestFail(t *testing.T) {
	require.Nil(t, Fail(118, "x", nil))
	var te *types.Error
	require.ErrorAs(t, Fail(118, "setting up masquerade", fmt.Errorf("w: %w", config.Invalid("uplinks[0]", "no such device"))), &te)
	require.Equal(t, uint(types.ErrInvalidNetworkConfig), te.Code)
	require.Contains(t, te.Msg, "uplinks[0]")
	require.ErrorAs(t, Fail(118, "x", types.NewError(120, "held", "")), &te)
	require.Equal(t, uint(120), te.Code)
	require.ErrorAs(t, Fail(118, "setting up masquerade", errors.New("map full")), &te)
	require.Equal(t, uint(118), te.Code)
	require.Equal(t, "setting up masquerade: map full", te.Msg)
	require.ErrorAs(t, Decode([]byte(`{"ipMasq": "yes"}`), &struct {
		IPMasq bool `json:"ipMasq"`
	}{}), &te)
	require.Equal(t, uint(types.ErrDecodingFailure), te.Code)
}

// minimal is a feature with only a name and keys: Base gives the rest.
type minimal struct{ Base }

func (minimal) Name() string              { return "minimal" }
func (minimal) Parse([]byte) (Pod, error) { return nil, nil }

var _ Feature = minimal{}
