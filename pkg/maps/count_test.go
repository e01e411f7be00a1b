package maps

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/require"
)

// TestCount: the entries of a hash map (in batches, across several), of
// an LPM trie and of a per-CPU hash (one key at a time) are counted.
func TestCount(t *testing.T) {
	for _, tc := range []struct {
		typ   ebpf.MapType
		flags uint32
		n     int
	}{
		{ebpf.Hash, 0, 0},
		{ebpf.Hash, 0, 10_000},
		{ebpf.LRUHash, 0, 300},
		{ebpf.LPMTrie, 1 /* BPF_F_NO_PREALLOC */, 500},
		{ebpf.PerCPUHash, 0, 40},
	} {
		t.Run(tc.typ.String(), func(t *testing.T) {
			m, err := ebpf.NewMap(&ebpf.MapSpec{Type: tc.typ, KeySize: 8, ValueSize: 12, MaxEntries: 16384, Flags: tc.flags})
			require.NoError(t, err)
			defer m.Close()
			possible, err := ebpf.PossibleCPU()
			require.NoError(t, err)
			for i := 0; i < tc.n; i++ {
				key := [8]byte{32, 0, 0, 0, byte(i), byte(i >> 8), byte(i >> 16), 1} // LPM: prefix length 32, then the data
				if tc.typ == ebpf.PerCPUHash {
					require.NoError(t, m.Put(key, make([][12]byte, possible)))
				} else {
					require.NoError(t, m.Put(key, [12]byte{}))
				}
			}
			got, err := Count(m)
			require.NoError(t, err)
			require.Equal(t, tc.n, got)
		})
	}
}
