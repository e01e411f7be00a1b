package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
	nodestate "github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// TestBPFSites loads the programs into a private bpffs and attributes a
// perf script made of their real JITed addresses: a hash lookup's samples
// must land on the source line and the map of the lookup that called it.
func TestBPFSites(t *testing.T) {
	bpfRoot := testutil.BPFFS(t)
	nd, err := nodestate.Open(nodestate.Options{BPFRoot: bpfRoot, StateDir: t.TempDir(), Objects: features.Objects(), Tag: features.Tag(), Lock: nodestate.Unlocked})
	require.NoError(t, err)
	t.Cleanup(nd.Close)
	_, err = nd.Programs()
	require.NoError(t, err)

	r, err := newBPFResolver()
	require.NoError(t, err)
	// to_netdev's lookup of a flow's OUT entry, and the line after it in
	// the JITed code (a different record).
	var lookup, other *bpfLine
	for i := range r.lines {
		l := &r.lines[i]
		if l.prog == "to_netdev" && strings.Contains(l.text, "bpf_map_lookup_elem(&nat, &s->out)") && lookup == nil {
			lookup = l
			for j := i + 1; j < len(r.lines); j++ {
				if r.lines[j].src != l.src && r.lines[j].prog == l.prog {
					other = &r.lines[j]
					break
				}
			}
		}
	}
	require.NotNil(t, lookup, "to_netdev's OUT lookup has no line record")
	require.NotNil(t, other)
	require.Equal(t, "nat", lookup.mp)
	require.Equal(t, lookup, r.resolve(lookup.addr))
	require.Equal(t, lookup, r.resolve(other.addr-1))
	require.Nil(t, r.resolve(1), "an address outside every program")

	prog := func(a uint64) string { return fmt.Sprintf("%x bpf_prog_0123456789abcdef_to_netdev+0x10", a) }
	var in bytes.Buffer
	// Two lookups called from the line (the return address is the next
	// record's first byte), one from a kernel path, one sample of the
	// program's own instructions (an IP, not a return address), and a
	// sample with no program frame.
	for range 2 {
		fmt.Fprintf(&in, "\tffffffff81000010 lookup_nulls_elem_raw+0x10\n\tffffffff81000100 __htab_map_lookup_elem+0x40\n\t%s\n\tffffffff81001000 cls_bpf_classify+0x99\n\n", prog(other.addr))
	}
	fmt.Fprintf(&in, "ffffffff81000010 lookup_nulls_elem_raw+0x10\nffffffff81000200 htab_map_update_elem+0x20\n\n")
	fmt.Fprintf(&in, "%s\nffffffff81001000 cls_bpf_classify+0x99\n\n", prog(other.addr))
	fmt.Fprintf(&in, "ffffffff81002000 tcp_ack+0x30\nffffffff81003000 tcp_rcv_established+0x10\n")

	rep, err := bpfSites(bytes.NewReader(in.Bytes()), r, "lookup_nulls_elem_raw")
	require.NoError(t, err)
	require.Equal(t, 3, rep.matched)
	require.Equal(t, 1, rep.outside)
	require.Len(t, rep.sites, 1)
	require.Equal(t, lookup.src, rep.sites[0].line.src)
	require.Equal(t, 2, rep.sites[0].samples)

	rep, err = bpfSites(bytes.NewReader(in.Bytes()), r, "")
	require.NoError(t, err)
	require.Equal(t, 5, rep.matched)
	require.Equal(t, 2, rep.outside)
	require.Len(t, rep.sites, 2)
	require.Equal(t, lookup.src, rep.sites[0].line.src)
	require.Equal(t, other.src, rep.sites[1].line.src, "the program's own IP is its own line")

	var out bytes.Buffer
	writeSites(&out, rep, 1)
	require.Contains(t, out.String(), lookup.src)
	require.Contains(t, out.String(), "66.7%")
	require.NotContains(t, out.String(), other.src+" ")
}
