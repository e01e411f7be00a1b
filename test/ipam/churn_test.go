package ipam_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/conflisttest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/errcode"
	"github.com/ebpf-cni/ebpf-cni/pkg/ipam"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// bookkeeping is what the node keeps of networks: the network IDs in each
// ebpf-ipam map and the directories under <stateDir>/ipam.
type bookkeeping struct {
	Allocs, Cursors, Nets map[uint32]int // network ID -> entries
	Masq                  map[uint32]int // masq_nets, masquerade's settings per network
	Dirs                  []string
}

func readBookkeeping(t *testing.T, bpfRoot, stateDir string) bookkeeping {
	t.Helper()
	b := bookkeeping{Allocs: map[uint32]int{}, Cursors: map[uint32]int{}, Nets: map[uint32]int{}, Masq: map[uint32]int{}}
	open := func(name string) *ebpf.Map {
		m, err := ebpf.LoadPinnedMap(filepath.Join(maps.Dir(bpfRoot), name), nil)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		require.NoError(t, err)
		t.Cleanup(func() { m.Close() })
		return m
	}
	if m := open(maps.CniMapIpamAllocs); m != nil {
		es, err := maps.Entries[maps.CniIpamKey, maps.CniIpamOwner](m)
		require.NoError(t, err)
		for _, e := range es {
			b.Allocs[e.Key.NetId]++
		}
	}
	if m := open(maps.CniMapIpamCursors); m != nil {
		es, err := maps.Entries[maps.CniIpamCursorKey, maps.CniIpamCursor](m)
		require.NoError(t, err)
		for _, e := range es {
			b.Cursors[e.Key.NetId]++
		}
	}
	if m := open(maps.CniMapIpamNets); m != nil {
		es, err := maps.Entries[uint32, maps.CniIpamNet](m)
		require.NoError(t, err)
		for _, e := range es {
			b.Nets[e.Key]++
		}
	}
	if m := open(maps.CniMapMasqNets); m != nil {
		es, err := maps.Entries[maps.CniMasqNetKey, maps.CniMasqNet](m)
		require.NoError(t, err)
		for _, e := range es {
			b.Masq[e.Key.NetId]++
		}
	}
	ents, err := os.ReadDir(filepath.Join(stateDir, "ipam"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range ents {
		b.Dirs = append(b.Dirs, e.Name())
	}
	sort.Strings(b.Dirs)
	return b
}

// requireOnly: the node keeps bookkeeping of exactly the live networks.
func (b bookkeeping) requireOnly(t *testing.T, live ...string) {
	t.Helper()
	ids := map[uint32]bool{}
	for _, n := range live {
		ids[ipam.NetID(n)] = true
	}
	for what, m := range map[string]map[uint32]int{maps.CniMapIpamAllocs: b.Allocs, maps.CniMapIpamCursors: b.Cursors, maps.CniMapIpamNets: b.Nets, maps.CniMapMasqNets: b.Masq} {
		for id := range m {
			require.True(t, ids[id], "%s holds network %#x, which has no address", what, id)
		}
	}
	for id := range ids {
		require.Positive(t, b.Nets[id], "live network %#x not registered", id)
		require.Positive(t, b.Allocs[id], "live network %#x holds no address", id)
	}
	want := append([]string{}, live...)
	sort.Strings(want)
	if len(want) == 0 {
		want = nil
	}
	require.Equal(t, want, b.Dirs, "state directories under <stateDir>/ipam")
}

// inProcess calls ebpf-ipam's verbs in this process, as ebpf-cni does.
func inProcessAdd(t *testing.T, stdin []byte, id string) {
	t.Helper()
	_, _, err := ipam.Add(&skel.CmdArgs{ContainerID: id, IfName: "eth0", Netns: "/var/run/netns/none", StdinData: stdin})
	require.NoError(t, err)
}

func inProcessDel(t *testing.T, stdin []byte, id string) {
	t.Helper()
	require.NoError(t, ipam.CmdDel(&skel.CmdArgs{ContainerID: id, IfName: "eth0", Netns: "/var/run/netns/none", StdinData: stdin}))
}

// TestNetworkChurn is the Must-hold of issue 27 for IPAM bookkeeping: a
// node that has seen 20,000 distinct networks come and go, one pod each,
// keeps nothing of them (ipam_nets holds 4,096 entries, ipam_cursors
// 16,384: before reference counting, ADD and DEL failed from the 4,090th
// network on), and ADD on a new network works.
//
// Pods through the real ebpf-cni (veth, programs, masquerade, ebpf-ipam in
// its process) for a sample of the networks, spread over the run; for the
// rest, ebpf-ipam's ADD and DEL in-process, as ebpf-cni calls them: the
// bookkeeping is the same, and a real pod costs ~100 ms where the
// in-process pair costs ~1 ms.
func TestNetworkChurn(t *testing.T) {
	const networks, every = 20_000, 500 // a real pod every 500th network: 40
	node := testutil.NewNode(t, false)
	start := time.Now()
	pods := 0
	ipamConf := func(name string) []byte {
		return []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"ipam":{"type":"ebpf-ipam","bpfRoot":%q,"stateDir":%q,"ranges":[[{"subnet":"10.250.0.0/24"}],[{"subnet":"fd00:250::/64"}]]}}`,
			name, node.BPFRoot, node.StateDir))
	}
	for i := 0; i < networks; i++ {
		name := fmt.Sprintf("churn-%05d", i)
		if i%every == 0 {
			list := node.List(t, conflisttest.Options{Name: name, Subnets: []string{"10.250.0.0/24", "fd00:250::/64"}, Keys: map[string]any{"ipMasq": true}})
			p := testutil.AddPod(t, node.CNI, list, fmt.Sprintf("pod-%05d", i))
			readBookkeeping(t, node.BPFRoot, node.StateDir).requireOnly(t, name)
			require.NoError(t, node.CNI.DelPod(list, p))
			pods++
			continue
		}
		stdin := ipamConf(name)
		require.NoError(t, node.NS.Do(func(ns.NetNS) error { // where ebpf-cni runs it
			inProcessAdd(t, stdin, "c")
			inProcessDel(t, stdin, "c")
			return nil
		}))
		if i%5000 == 1 {
			readBookkeeping(t, node.BPFRoot, node.StateDir).requireOnly(t)
		}
	}
	t.Logf("%d networks created and deleted (%d pods through ebpf-cni) in %s", networks, pods, time.Since(start).Round(time.Second))
	readBookkeeping(t, node.BPFRoot, node.StateDir).requireOnly(t)

	// A new network after all that: a real pod, then DEL leaves nothing.
	list := node.List(t, conflisttest.Options{Name: "after-churn", Keys: map[string]any{"ipMasq": true}})
	p := testutil.AddPod(t, node.CNI, list, "after")
	readBookkeeping(t, node.BPFRoot, node.StateDir).requireOnly(t, "after-churn")
	require.NoError(t, node.CNI.DelPod(list, p))
	readBookkeeping(t, node.BPFRoot, node.StateDir).requireOnly(t)
}

// A DEL, CHECK, STATUS or GC of a network the node does not know creates
// and registers nothing; a full registry blocks no DEL and fails an ADD
// with code 106 naming the map and the remedy, leaving nothing behind.
func TestFullRegistry(t *testing.T) {
	e := newEnv(t)
	stdin := e.conf("1.1.0", `"subnet":"10.62.0.0/24"`)
	e.add("a", stdin, "")

	e.network = "unknown"
	other := e.conf("1.1.0", `"subnet":"10.63.0.0/24"`)
	e.run("DEL", "x", other, "").Must(t)
	e.run("STATUS", "", other, "").Must(t)
	require.Equal(t, errcode.AllocationMismatch, e.run("CHECK", "x", other, "").Error(t).Code)
	e.run("GC", "", e.conf("1.1.0", `"subnet":"10.63.0.0/24"`, `"cni.dev/valid-attachments":[]`), "").Must(t)
	readBookkeeping(t, e.bpfRoot, e.stateDir).requireOnly(t, "testnet")

	// Fill the registry with networks of no address (as an older version
	// left them).
	ms, err := maps.OpenPinned(e.bpfRoot, maps.CniMapIpamNets)
	require.NoError(t, err)
	nets := ms[maps.CniMapIpamNets]
	defer nets.Close()
	for i := 0; ; i++ {
		var v maps.CniIpamNet
		name := fmt.Sprintf("stale-%d", i)
		maps.CString(v.Name[:], name)
		if err := nets.Update(ipam.NetID(name), &v, ebpf.UpdateNoExist); err != nil {
			require.ErrorContains(t, err, "too big", "the registry is full")
			break
		}
	}
	cerr := e.run("STATUS", "", other, "").Error(t)
	require.Equal(t, types.ErrPluginNotAvailable, cerr.Code, cerr.Msg)
	require.Contains(t, cerr.Msg, "ipam_nets is full")
	e.network = "testnet"
	e.run("STATUS", "", stdin, "").Must(t) // registered: its ADD needs no room there
	e.network = "unknown"
	cerr = e.run("ADD", "x", other, "").Error(t)
	require.Equal(t, errcode.MapFull, cerr.Code, cerr.Msg)
	require.Contains(t, cerr.Msg, "ipam_nets is full (4096 entries")
	require.Contains(t, cerr.Msg, "ebpf-cni gc")
	e.run("DEL", "x", other, "").Must(t)
	_, err = os.Stat(filepath.Join(e.stateDir, "ipam", "unknown"))
	require.ErrorIs(t, err, os.ErrNotExist, "a failed ADD left the network's directory")

	// DEL of a live network is not blocked by the full registry either.
	e.network = "testnet"
	e.run("DEL", "a", stdin, "").Must(t)
	e.requireNothingHeld()

	// GC of any network forgets every network without an address.
	e.run("GC", "", e.conf("1.1.0", `"subnet":"10.62.0.0/24"`, `"cni.dev/valid-attachments":[]`), "").Must(t)
	readBookkeeping(t, e.bpfRoot, e.stateDir).requireOnly(t)
	e.network = "unknown"
	require.NotEmpty(t, e.add("x", other, "").IPs, "ADD on a new network once GC made room")
}

// Many calls on one network, each the last to hold an address when it
// ends: Forget removes the directory under the lock while others wait on
// it; none may fail or hand out an address twice.
func TestForgetWhileOthersWait(t *testing.T) {
	e := newEnv(t)
	stdin := e.conf("1.1.0", `"subnet":"10.64.0.0/24"`)
	const workers, rounds = 6, 15
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		go func(w int) {
			var err error
			defer func() { errs <- err }()
			for r := 0; r < rounds && err == nil; r++ {
				id := fmt.Sprintf("w%d-%d", w, r)
				for _, cmd := range []string{"ADD", "DEL"} {
					var out *testutil.Output
					_ = e.node.NS.Do(func(ns.NetNS) error {
						out = testutil.Run(t, e.bin, testutil.Call{Command: cmd, ContainerID: id, NetNS: "/var/run/netns/none", IfName: "eth0", Path: "/nonexistent", Stdin: stdin})
						return nil
					})
					if out.ExitCode != 0 {
						err = fmt.Errorf("%s %s: exit %d: %s", cmd, id, out.ExitCode, out.Stdout)
						break
					}
				}
			}
		}(w)
	}
	for w := 0; w < workers; w++ {
		require.NoError(t, <-errs)
	}
	e.requireNothingHeld()
	readBookkeeping(t, e.bpfRoot, e.stateDir).requireOnly(t)
}
