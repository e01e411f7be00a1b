package cli_test

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/cli"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// TestStatusMapFill: status lists how full the maps pods fill are (a pod's
// endpoint_devs entry against the map's capacity), says nothing of them
// while they have room, a note from 80% of a map that refuses new entries
// and a problem (exit 3) from 95%, and neither once the entries are gone.
func TestStatusMapFill(t *testing.T) {
	e := newEnv(t)
	list := e.confList(testutil.BestMode())
	e.addPod(list, "fill-0")

	fillOf := func(st cli.Status, name string) maps.Fill {
		for _, f := range st.Maps {
			if f.Name == name {
				return f
			}
		}
		return maps.Fill{}
	}
	var st cli.Status
	e.json(&st, cli.ExitOK, "status")
	require.Equal(t, maps.Fill{Name: maps.CniMapEndpointDevs, Entries: 1, Capacity: 16384}, fillOf(st, maps.CniMapEndpointDevs))
	require.Zero(t, fillOf(st, maps.CniMapUplinks).Entries, "no uplink in this node")
	for _, f := range st.Maps {
		require.Positive(t, f.Entries, "status lists only maps holding an entry: %+v", f)
	}
	r := e.cli("status")
	require.Equal(t, cli.ExitOK, r.code, "%s", r)
	require.Regexp(t, `(?m)^endpoint_devs\s+1\s+16k\s+0\.0%$`, r.stdout, "human-sized numbers; JSON has them exact")

	// uplinks holds 256: fake devices that no packet names.
	up, err := ebpf.LoadPinnedMap(filepath.Join(maps.Dir(e.bpfRoot), maps.CniMapUplinks), nil)
	require.NoError(t, err)
	defer up.Close()
	capacity := int(up.MaxEntries())
	var keys []uint32
	fill := func(n int) {
		for len(keys) < n {
			k := uint32(1_000_000 + len(keys))
			require.NoError(t, up.Put(k, maps.CniUplinkInfo{Has4: 1, Ip4: [4]uint8{192, 0, 2, 200}}))
			keys = append(keys, k)
		}
	}
	t.Cleanup(func() {
		for _, k := range keys {
			_ = up.Delete(k)
		}
	})
	about := regexp.MustCompile(`map uplinks is`)
	mentions := func(ss []string) bool { return slices.ContainsFunc(ss, about.MatchString) }

	fill(capacity * 85 / 100)
	e.json(&st, cli.ExitOK, "status")
	require.Equal(t, len(keys), fillOf(st, maps.CniMapUplinks).Entries)
	require.True(t, mentions(st.Notes), "a note at 85%%: %v", st.Notes)
	require.False(t, mentions(st.Problems), "%v", st.Problems)

	fill(capacity * 96 / 100)
	e.json(&st, cli.ExitProblems, "status")
	require.True(t, mentions(st.Problems), "a problem at 96%%: %v", st.Problems)
	require.Equal(t, "uplinks", st.Maps[0].Name, "the fullest map first")
	r = e.cli("status")
	require.Equal(t, cli.ExitProblems, r.code, "%s", r)
	require.Regexp(t, fmt.Sprintf(`(?m)^uplinks\s+%d\s+%d\s+9[0-9.]+%%$`, len(keys), capacity), r.stdout)
	require.Contains(t, r.stdout, "map uplinks is 95% full or more")

	for _, k := range keys {
		require.NoError(t, up.Delete(k))
	}
	keys = nil
	e.json(&st, cli.ExitOK, "status")
	require.Zero(t, fillOf(st, maps.CniMapUplinks).Entries)
	require.False(t, mentions(st.Notes) || mentions(st.Problems), "%v %v", st.Notes, st.Problems)
	require.False(t, strings.Contains(strings.Join(st.Problems, "\n"), "fill"), "%v", st.Problems)
}
