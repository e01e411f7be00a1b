package ipam

import (
	"encoding/binary"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

func openTestStore(t *testing.T) (*Store, *Config) {
	t.Helper()
	c, _, err := ParseConfig(conf(`"subnet":"10.9.0.0/24","bpfRoot":"`+testutil.BPFFS(t)+`","stateDir":"`+t.TempDir()+`"`), "")
	require.NoError(t, err)
	s, err := Open(c)
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s, c
}

// The generated Go types must match the C layout the programs use.
func TestGeneratedLayouts(t *testing.T) {
	require.EqualValues(t, 24, unsafe.Sizeof(maps.CniIpamKey{}))
	require.EqualValues(t, 160, unsafe.Sizeof(maps.CniIpamOwner{}))
	require.EqualValues(t, 144, unsafe.Offsetof(maps.CniIpamOwner{}.RangeSet))
	require.Equal(t, 128, maps.CniContainerIDLen)
	require.Equal(t, 16, maps.CniIfNameLen)
}

// A tc program can look an address up in the pinned allocation map (none
// of the datapath's does today: anti-spoofing reads endpoint_devs; the map
// stays usable by programs). The program builds the key of
// 10.9.0.7 in network NetID("n") on its stack, looks it up, and returns the
// range set of the owner (or 0xff when the address is free).
func TestAllocationMapReadableFromBPF(t *testing.T) {
	s, _ := openTestStore(t)
	ip := net.ParseIP("10.9.0.7").To4()
	require.NoError(t, s.Reserve(ip, "ctr", "eth0", 7))

	m, err := ebpf.LoadPinnedMap(filepath.Join(maps.Dir(s.root), maps.CniMapIpamAllocs), nil)
	require.NoError(t, err)
	defer m.Close()

	key := s.key(ip)
	raw := make([]byte, 24)
	binary.LittleEndian.PutUint32(raw[0:], key.NetId)
	raw[4] = key.Family
	copy(raw[8:], key.Addr[:])
	insns := asm.Instructions{}
	for off := 0; off < 24; off += 4 {
		insns = append(insns, asm.StoreImm(asm.RFP, int16(off-24), int64(int32(binary.LittleEndian.Uint32(raw[off:]))), asm.Word))
	}
	insns = append(insns,
		asm.LoadMapPtr(asm.R1, m.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -24),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "free"),
		asm.LoadMem(asm.R0, asm.R0, int16(unsafe.Offsetof(maps.CniIpamOwner{}.RangeSet)), asm.Word),
		asm.Return(),
		asm.Mov.Imm(asm.R0, 0xff).WithSymbol("free"),
		asm.Return(),
	)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, Instructions: insns, License: "GPL"})
	require.NoError(t, err)
	defer prog.Close()

	pkt := make([]byte, 64)
	ret, err := prog.Run(&ebpf.RunOptions{Data: pkt})
	require.NoError(t, err)
	require.EqualValues(t, 7, ret, "the program sees the owner's range set")

	require.NoError(t, s.Release(ip))
	ret, err = prog.Run(&ebpf.RunOptions{Data: pkt})
	require.NoError(t, err)
	require.EqualValues(t, 0xff, ret, "a released address is free to the program too")
}

func TestLongContainerIDsStayDistinct(t *testing.T) {
	s, c := openTestStore(t)
	long := func(last byte) string {
		b := make([]byte, 300)
		for i := range b {
			b[i] = 'a'
		}
		b[299] = last
		return string(b)
	}
	a, err := Allocate(s, c, long('x'), "eth0")
	require.NoError(t, err)
	b, err := Allocate(s, c, long('y'), "eth0")
	require.NoError(t, err)
	require.NotEqual(t, a[0].Address.String(), b[0].Address.String())
	again, err := Allocate(s, c, long('x'), "eth0")
	require.NoError(t, err)
	require.Equal(t, a[0].Address.String(), again[0].Address.String())
	require.NoError(t, ReleaseAttachment(s, long('x'), "eth0"))
	entries, err := s.Entries()
	require.NoError(t, err)
	require.Len(t, entries, 1)
	require.Equal(t, b[0].Address.IP.String(), entries[0].IP.String())
}

// Container IDs come from the runtime; a hostile one must not escape the
// state directory.
func TestAttachmentFileNamesAreConfined(t *testing.T) {
	s, _ := openTestStore(t)
	p := s.attachmentFile("../../../etc/passwd", "eth0")
	require.Equal(t, filepath.Join(s.dir, "owners"), filepath.Dir(p))
}

// Allocate fills the empty record it wrote first in place (same file),
// where a longer-than-a-page or shorter record takes a new file and a
// rename; every way, the record read back is the one written.
func TestFillAttachmentInPlace(t *testing.T) {
	s, c := openTestStore(t)
	inode := func(id string) uint64 {
		t.Helper()
		var st unix.Stat_t
		require.NoError(t, unix.Stat(s.attachmentFile(id, "eth0"), &st))
		return st.Ino
	}
	readBack := func(id string) *Attachment {
		t.Helper()
		a, err := s.Attachment(id, "eth0")
		require.NoError(t, err)
		require.NotNil(t, a)
		return a
	}

	empty := &Attachment{ContainerID: "c1", IfName: "eth0", NetNS: "/run/netns/p1"}
	require.NoError(t, s.SaveAttachment(empty))
	before := inode("c1")
	full := &Attachment{ContainerID: "c1", IfName: "eth0", NetNS: "/run/netns/p1",
		IPs: []Allocation{{Address: net.ParseIP("10.9.0.7")}, {Address: net.ParseIP("fd00::7"), RangeSet: 1}}}
	require.NoError(t, s.FillAttachment(full))
	require.Equal(t, before, inode("c1"), "filled in place")
	require.Equal(t, full, readBack("c1"))

	// Shorter than what is there: a new file, or the old tail would stay.
	require.NoError(t, s.FillAttachment(empty))
	require.NotEqual(t, before, inode("c1"))
	require.Equal(t, empty, readBack("c1"))

	// More than a page: a new file.
	require.NoError(t, s.SaveAttachment(empty))
	before = inode("c1")
	long := &Attachment{ContainerID: "c1", IfName: "eth0", NetNS: "/run/netns/" + strings.Repeat("p", 5000)}
	require.NoError(t, s.FillAttachment(long))
	require.NotEqual(t, before, inode("c1"))
	require.Equal(t, long, readBack("c1"))

	// Allocate itself: the record it leaves holds the address, in the file
	// it created first.
	ips, err := AllocateIn(s, c, "c2", "eth0", "/run/netns/p2")
	require.NoError(t, err)
	a := readBack("c2")
	require.Len(t, a.IPs, 1)
	require.True(t, a.IPs[0].Address.Equal(ips[0].Address.IP))
}
