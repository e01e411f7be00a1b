package maps

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

// The layout table used on the fast path must agree with the object.
func TestLayoutsMatchTheObject(t *testing.T) {
	spec, err := LoadCni()
	require.NoError(t, err)
	require.Len(t, layouts, len(spec.Maps), "every map has a fast-path layout")
	for name, l := range layouts {
		ms := spec.Maps[name]
		require.NotNil(t, ms, name)
		require.Equal(t, layoutOf(ms), l, name)
	}
}

func TestOpenPinnedCreatesOnceAndReuses(t *testing.T) {
	root := testutil.BPFFS(t)
	first, err := OpenPinned(root, CniMapIpamAllocs, CniMapNodeCounters)
	require.NoError(t, err)
	info, err := first[CniMapIpamAllocs].Info()
	require.NoError(t, err)
	id1, _ := info.ID()
	for _, m := range first {
		m.Close()
	}
	again, err := OpenPinned(root, CniMapIpamAllocs)
	require.NoError(t, err)
	defer again[CniMapIpamAllocs].Close()
	info, err = again[CniMapIpamAllocs].Info()
	require.NoError(t, err)
	id2, _ := info.ID()
	require.Equal(t, id1, id2, "the pinned map is reused, not recreated")
}

func TestOpenPinnedRefusesForeignLayout(t *testing.T) {
	root := testutil.BPFFS(t)
	require.NoError(t, os.MkdirAll(Dir(root), 0o700))
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 8, ValueSize: 8, MaxEntries: 4})
	require.NoError(t, err)
	defer m.Close()
	require.NoError(t, m.Pin(filepath.Join(Dir(root), CniMapIpamAllocs)))
	_, err = OpenPinned(root, CniMapIpamAllocs)
	require.True(t, errors.Is(err, ErrIncompatible), "got %v", err)
}

// OpenPinned tells a pin of another kind by what the kernel says of it read
// as a map (no readlink of /proc/self/fd): a map of another type with the
// same sizes, and a program, are refused like another layout, and a missing
// pin is os.ErrNotExist to ObjGet.
func TestOpenPinnedRefusesOtherKinds(t *testing.T) {
	root := testutil.BPFFS(t)
	require.NoError(t, os.MkdirAll(Dir(root), 0o700))
	want := layouts[CniMapIpamAllocs]
	require.NotEqual(t, uint32(ebpf.LRUHash), want.typ)
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.LRUHash, KeySize: want.key, ValueSize: want.value, MaxEntries: 4})
	require.NoError(t, err)
	defer m.Close()
	require.NoError(t, m.Pin(filepath.Join(Dir(root), CniMapIpamAllocs)))
	_, err = OpenPinned(root, CniMapIpamAllocs)
	require.ErrorIs(t, err, ErrIncompatible)
	require.ErrorContains(t, err, "LRUHash")

	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SocketFilter, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	require.NoError(t, err)
	defer prog.Close()
	for _, name := range []string{CniMapIpamCursors, CniMapNodeCounters, CniMapEndpoints} {
		require.NoError(t, prog.Pin(filepath.Join(Dir(root), name)))
		_, err = OpenPinned(root, name)
		require.ErrorIs(t, err, ErrIncompatible, name)
	}

	_, err = ObjGet(filepath.Join(Dir(root), "no-such-pin"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestCheckBPFFS(t *testing.T) {
	require.ErrorIs(t, CheckBPFFS(t.TempDir()+"/x/y"), ErrNotBPFFS)
	require.NoError(t, CheckBPFFS(testutil.BPFFS(t)+"/not/yet/created"))
}

func TestIDMatchesInfo(t *testing.T) {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	require.NoError(t, err)
	defer m.Close()
	info, err := m.Info()
	require.NoError(t, err)
	want, _ := info.ID()
	got, err := ID(m)
	require.NoError(t, err)
	require.EqualValues(t, want, got)
	require.NotZero(t, got)
}

// TestPinName: a name with dots (a release version, a VLAN device) becomes
// one bpffs takes, and back; two names never meet.
func TestPinName(t *testing.T) {
	bpfRoot := testutil.BPFFS(t)
	require.NoError(t, os.MkdirAll(bpfRoot, 0o700))
	err := os.Mkdir(filepath.Join(bpfRoot, "v0.1.0"), 0o700)
	require.ErrorIs(t, err, os.ErrPermission, "bpffs refuses a name with a dot")
	seen := map[string]string{}
	for _, s := range []string{"v0.1.0-5-gabc1234", "eth0.100", "eth0%2e100", "eth0_100", "plain", "%", "a.%b"} {
		p := PinName(s)
		require.NotContains(t, p, ".", s)
		require.NoError(t, os.Mkdir(filepath.Join(bpfRoot, p), 0o700), "bpffs takes %q", p)
		require.Equal(t, s, FromPinName(p))
		require.NotContains(t, seen, p, "%q and %q meet", s, seen[p])
		seen[p] = s
	}
	require.Equal(t, "plain", PinName("plain"))
}
