package ipam_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/errcode"
	"github.com/ebpf-cni/ebpf-cni/pkg/ipam"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// bpfMount is the bpffs mount point holding e.bpfRoot.
func (e *env) bpfMount() string { return filepath.Dir(e.bpfRoot) }

// DEL while bpfRoot is not on a mounted bpffs (a node just rebooted, or
// bpffs unmounted) succeeds and releases the records; when a bpffs is
// mounted again, the deleted attachment's address is free and the others'
// are still held.
func TestDelWithoutBPFFS(t *testing.T) {
	for _, ver := range testutil.SpecVersions {
		t.Run(ver, func(t *testing.T) {
			e := newEnv(t)
			stdin := e.conf(ver, `"subnet":"10.173.0.0/24"`)
			a := ipsOf(e.add("a", stdin, ""))[0]
			b := ipsOf(e.add("b", stdin, ""))[0]

			require.NoError(t, unix.Unmount(e.bpfMount(), unix.MNT_DETACH))
			e.run("DEL", "a", stdin, "").Must(t)
			e.run("DEL", "a", stdin, "").Must(t) // idempotent
			e.run("DEL", "never-added", stdin, "").Must(t)
			_, records := e.held()
			require.Equal(t, []string{"b:eth0"}, records)
			// What needs the map still says it cannot reach it.
			require.Equal(t, errcode.StateUnavailable, e.run("ADD", "c", stdin, "").Error(t).Code)

			require.NoError(t, unix.Mount("bpf", e.bpfMount(), "bpf", 0, ""))
			// a's address is free, b's is not.
			require.Equal(t, []string{a}, ipsOf(e.add("c", stdin, "IP="+a)))
			require.Equal(t, errcode.AddressInUse, e.run("ADD", "d", stdin, "IP="+b).Error(t).Code)
			e.run("DEL", "b", stdin, "").Must(t)
			e.run("DEL", "c", stdin, "").Must(t)
			e.requireNothingHeld()
		})
	}
}

// The same bpffs (and so the same map, with the deleted attachment's entry)
// may come back: it was still mounted elsewhere and is bound here again.
// The address released without bpffs is taken out of it too.
func TestDelWithoutBPFFSThenSameMapReturns(t *testing.T) {
	e := newEnv(t)
	stdin := e.conf("1.1.0", `"ranges":[[{"subnet":"10.174.0.0/24"}],[{"subnet":"fd74::/64"}]]`)
	a := ipsOf(e.add("a", stdin, ""))
	b := ipsOf(e.add("b", stdin, ""))

	elsewhere := filepath.Join(t.TempDir(), "bpffs-elsewhere")
	require.NoError(t, os.Mkdir(elsewhere, 0o700))
	require.NoError(t, unix.Mount(e.bpfMount(), elsewhere, "", unix.MS_BIND, ""))
	t.Cleanup(func() { _ = unix.Unmount(elsewhere, unix.MNT_DETACH) })
	require.NoError(t, unix.Unmount(e.bpfMount(), unix.MNT_DETACH))

	e.run("DEL", "a", stdin, "").Must(t)

	require.NoError(t, unix.Mount(elsewhere, e.bpfMount(), "", unix.MS_BIND, ""))
	addrs, _ := e.held()
	require.ElementsMatch(t, append(append([]string{}, a...), b...), addrs, "the old map, with a's entry, is back")
	// The next call takes a's addresses out before it allocates.
	require.Equal(t, a, ipsOf(e.add("c", stdin, "IP="+a[0]+","+a[1])))
	require.Equal(t, errcode.AddressInUse, e.run("ADD", "d", stdin, "IP="+b[0]).Error(t).Code)
	_, err := os.Stat(filepath.Join(e.stateDir, "ipam", e.network, "released"))
	require.ErrorIs(t, err, os.ErrNotExist, "the released records are consumed")
	for _, id := range []string{"b", "c"} {
		e.run("DEL", id, stdin, "").Must(t)
	}
	e.requireNothingHeld()
}

// After a reboot neither bpffs nor the state directory is there: DEL has
// nothing to release, succeeds, and creates nothing.
func TestDelAfterRebootCreatesNothing(t *testing.T) {
	e := newEnv(t)
	require.NoError(t, unix.Unmount(e.bpfMount(), unix.MNT_DETACH))
	e.run("DEL", "a", e.conf("0.4.0", `"subnet":"10.175.0.0/24"`), "").Must(t)
	_, err := os.Stat(e.stateDir)
	require.ErrorIs(t, err, os.ErrNotExist)
	ents, err := os.ReadDir(e.bpfMount())
	require.NoError(t, err)
	require.Empty(t, ents, "nothing written where bpffs should be")
}

// STATUS answers 50 whenever ebpf-ipam cannot serve an ADD, whatever the
// reason, never its own codes (103, 104) or an I/O error.
func TestStatusNotAvailableIs50(t *testing.T) {
	for _, tc := range []struct {
		name    string
		prepare func(e *env) []byte // returns the configuration
		words   string
	}{
		{"bpfRoot not on bpffs", func(e *env) []byte {
			require.NoError(t, unix.Unmount(e.bpfMount(), unix.MNT_DETACH))
			return e.conf("1.1.0", `"subnet":"10.176.0.0/24"`)
		}, "mount -t bpf"},
		{"stateDir unusable", func(e *env) []byte {
			require.NoError(t, os.WriteFile(e.stateDir, nil, 0o600)) // a file where the directory should be
			return e.conf("1.1.0", `"subnet":"10.176.0.0/24"`)
		}, "stateDir"},
		{"pinned map of another layout", func(e *env) []byte {
			m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 1})
			require.NoError(t, err)
			defer m.Close()
			require.NoError(t, os.MkdirAll(maps.Dir(e.bpfRoot), 0o700))
			require.NoError(t, m.Pin(filepath.Join(maps.Dir(e.bpfRoot), maps.CniMapIpamAllocs)))
			return e.conf("1.1.0", `"subnet":"10.176.0.0/24"`)
		}, "another layout"},
		{"network ID taken", func(e *env) []byte {
			ms, err := maps.OpenPinned(e.bpfRoot, maps.CniMapIpamNets)
			require.NoError(t, err)
			defer ms[maps.CniMapIpamNets].Close()
			var v maps.CniIpamNet
			maps.CString(v.Name[:], "someothernet")
			require.NoError(t, ms[maps.CniMapIpamNets].Put(ipam.NetID(e.network), &v))
			return e.conf("1.1.0", `"subnet":"10.176.0.0/24"`)
		}, "someothernet"},
		{"resolvConf unreadable", func(e *env) []byte {
			return e.conf("1.1.0", `"subnet":"10.176.0.0/24","resolvConf":"/nonexistent/resolv.conf"`)
		}, "resolvConf"},
		{"range full", func(e *env) []byte {
			stdin := e.conf("1.1.0", `"subnet":"10.176.0.0/30"`) // .2 only
			e.add("a", stdin, "")
			return stdin
		}, "1 of 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			stdin := tc.prepare(e)
			cerr := e.run("STATUS", "", stdin, "").Error(t)
			require.Equal(t, uint(types.ErrPluginNotAvailable), cerr.Code, "%s %s", cerr.Msg, cerr.Details)
			require.True(t, strings.Contains(cerr.Msg, tc.words), "message %q does not say %q", cerr.Msg, tc.words)
		})
	}
}
