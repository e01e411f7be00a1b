package repair

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// TestEachLocksOnlyWhatDiffers: a node in order (every host veth recorded,
// every record's veth present) takes no attachment lock. STATUS runs every
// 5 s; 200 lock files for 100 pods took its repair from 1.7 to 5.2 ms.
func TestEachLocksOnlyWhatDiffers(t *testing.T) {
	var locked []string
	saved := lockAttachment
	lockAttachment = func(_ *node.Node, name string, f func() error) error {
		locked = append(locked, name)
		return f()
	}
	t.Cleanup(func() { lockAttachment = saved })

	r := &run{o: Options{Skip: "veth-own"}}
	var ran []string
	names := []string{"veth-a", "veth-b", "veth-own", "veth-c"}
	r.each(names, map[string]bool{"veth-a": true, "veth-c": true}, func(name string) error {
		ran = append(ran, name)
		return nil
	})
	require.Equal(t, []string{"veth-b"}, locked, "locked")
	require.Equal(t, []string{"veth-b"}, ran, "ran")

	locked, ran = nil, nil
	all := map[string]bool{}
	for _, n := range names {
		all[n] = true
	}
	r.each(names, all, func(name string) error { ran = append(ran, name); return nil })
	require.Empty(t, locked, "a node in order took attachment locks")
	require.Empty(t, ran)

	r.each(names, nil, func(name string) error { ran = append(ran, name); return nil })
	require.Equal(t, []string{"veth-a", "veth-b", "veth-c"}, locked)
	require.Equal(t, locked, ran)
}
