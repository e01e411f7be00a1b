package datapath_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// ipamHeld is what ebpf-ipam's map holds: address -> container ID.
func (e *env) ipamHeld() map[string]string {
	e.t.Helper()
	m, err := maps.OpenPinned(e.bpfRoot, maps.CniMapIpamAllocs)
	require.NoError(e.t, err)
	defer m[maps.CniMapIpamAllocs].Close()
	out := map[string]string{}
	var k maps.CniIpamKey
	var v maps.CniIpamOwner
	it := m[maps.CniMapIpamAllocs].Iterate()
	for it.Next(&k, &v) {
		out[maps.IP(k.Family, k.Addr).String()] = maps.GoString(v.ContainerId[:])
	}
	require.NoError(e.t, it.Err())
	return out
}

// requireConsistent asserts that every endpoint entry points at a live
// host veth of ours, every live veth has its record and entries, and every
// address a live pod has is held in ebpf-ipam by its container.
func (e *env) requireConsistent(what string) {
	e.t.Helper()
	live := map[int]netlink.Link{}
	for _, l := range e.hostLinks() {
		live[l.Attrs().Index] = l
	}
	nd := e.handle()
	defer nd.Close()
	em, err := endpoint.MapsOf(nd)
	require.NoError(e.t, err)
	devs, err := em.Devices()
	require.NoError(e.t, err)
	for _, d := range devs {
		require.NotNil(e.t, live[d.IfIndex], "%s: endpoint_devs[%d] points at no live veth", what, d.IfIndex)
	}
	addrs, err := em.Addresses()
	require.NoError(e.t, err)
	for ip, v := range addrs {
		require.NotNil(e.t, live[int(v.Ifindex)], "%s: endpoints[%s] points at dead ifindex %d", what, ip, v.Ifindex)
	}
	held := e.ipamHeld()
	for idx, l := range live {
		r, err := node.ReadRecord(e.stateDir, l.Attrs().Name)
		require.NoError(e.t, err, "%s: live veth %s without a record", what, l.Attrs().Name)
		require.Equal(e.t, idx, r.HostIfIndex)
		for _, ip := range r.Addrs() {
			require.Equal(e.t, r.ContainerID, held[ip.String()], "%s: %s of live pod %s is not held by it in ebpf-ipam", what, ip, r.ContainerID)
			v, ok := addrs[ip.String()]
			require.True(e.t, ok, "%s: no endpoints entry for live %s", what, ip)
			require.Equal(e.t, uint32(idx), v.Ifindex)
		}
	}
}

// TestSameContainerRaced: a runtime that retries after a timeout calls
// ADD twice for one container at once, or ADD and DEL at once (the spec
// forbids it; runtimes do it). 20 rounds of each: an address a live pod
// holds is never free in ebpf-ipam, no map entry points at a dead
// ifindex, and what is left is either the whole attachment or nothing.
func TestSameContainerRaced(t *testing.T) {
	e := newEnv(t)
	list := e.confList(netOpts{})
	peer := e.addPod(list, "peer")
	runtimes := []*nettest.CNI{nettest.NewCNI(e.node, e.paths, t.TempDir()), nettest.NewCNI(e.node, e.paths, t.TempDir())}
	for round := range 20 {
		id := fmt.Sprintf("twice-%d", round)
		pod := testutil.NetNS(t)
		rt := &libcni.RuntimeConf{ContainerID: id, NetNS: pod.Path(), IfName: "eth0"}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		results := make([]*current.Result, 2)
		for i, c := range runtimes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i], errs[i] = c.Add(list, rt)
			}()
		}
		wg.Wait()
		won := slices.IndexFunc(errs, func(err error) bool { return err == nil })
		require.GreaterOrEqual(t, won, 0, "round %d: no ADD succeeded: %v", round, errs)
		e.requireConsistent(fmt.Sprintf("round %d, two ADDs", round))
		mustConnect(t, []*nettest.Pod{peer, {NS: pod, RT: rt, Result: results[won]}})

		// ADD and DEL at once.
		other := fmt.Sprintf("raced-%d", round)
		pod2 := testutil.NetNS(t)
		rt2 := &libcni.RuntimeConf{ContainerID: other, NetNS: pod2.Path(), IfName: "eth0"}
		for i, c := range runtimes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if i == 0 {
					_, errs[i] = c.Add(list, rt2)
				} else {
					errs[i] = c.Del(list, rt2)
				}
			}()
		}
		wg.Wait()
		require.NoError(t, errs[1], "round %d: DEL", round)
		e.requireConsistent(fmt.Sprintf("round %d, ADD and DEL", round))
		require.NoError(t, runtimes[1].Del(list, rt2))
		require.NoError(t, runtimes[0].Del(list, rt))
		e.requireConsistent(fmt.Sprintf("round %d, after DEL", round))
		for ip, cid := range e.ipamHeld() {
			require.Contains(t, []string{"peer"}, cid, "round %d: %s still held by %s", round, ip, cid)
		}
	}
}

// bareVeth makes what a call killed right after creating the pair leaves:
// the pair with its name and group, no alias, no record, no map entry.
func (e *env) bareVeth(containerID string) (string, ns.NetNS) {
	e.t.Helper()
	pod := testutil.NetNS(e.t)
	name := veth.HostName(containerID, "eth0")
	_, err := nettest.Run(e.node.NS, "ip", "link", "add", "name", name, "group", fmt.Sprint(veth.Group), "type", "veth", "peer", "name", "eth0", "netns", pod.Path())
	require.NoError(e.t, err)
	return name, pod
}

// TestKilledHalfWay: a pair left by a call killed before it was named (no
// alias, no record, no entry) is removed by one DEL, or by the next
// STATUS or GC without one; after it the same container's ADD works. A
// pod whose alias and record were lost (killed between the entries and
// the record) gets both back from STATUS and then DELs cleanly.
func TestKilledHalfWay(t *testing.T) {
	e := newEnv(t)
	list := e.confList(netOpts{})
	keep := e.addPod(list, "keep")
	gone := func(name string) bool {
		for _, l := range e.hostLinks() {
			if l.Attrs().Name == name {
				return false
			}
		}
		return true
	}
	for _, how := range []string{"DEL", "STATUS", "GC"} {
		id := "killed-" + how
		name, pod := e.bareVeth(id)
		require.False(t, gone(name), "the bare pair is ours (its group)")
		rt := &libcni.RuntimeConf{ContainerID: id, NetNS: pod.Path(), IfName: "eth0"}
		switch how {
		case "DEL":
			require.NoError(t, e.cni.Del(list, rt), "DEL of a pair killed before its alias")
		case "STATUS":
			require.NoError(t, e.cni.Status(list))
		case "GC":
			require.NoError(t, e.cni.GC(list, []types.GCAttachment{{ContainerID: "keep", IfName: "eth0"}}))
		}
		require.True(t, gone(name), "%s left the half-made pair", how)
		_, err := e.cni.Add(list, rt)
		require.NoError(t, err, "ADD after %s", how)
		require.NoError(t, e.cni.Del(list, rt))
	}

	// The alias and the record lost, the entries there: STATUS rebuilds.
	p := e.addPod(list, "unnamed")
	name := p.Result.Interfaces[0].Name
	_, err := nettest.Run(e.node.NS, "ip", "link", "set", "dev", name, "alias", "")
	require.NoError(t, err)
	require.NoError(t, os.Remove(filepath.Join(e.stateDir, "endpoints", name+".json")))
	require.NoError(t, e.cni.Status(list))
	r, err := node.ReadRecord(e.stateDir, name)
	require.NoError(t, err, "STATUS rebuilt the record")
	require.Equal(t, "unnamed", r.ContainerID)
	require.ElementsMatch(t, []string{p.IP(4).String(), p.IP(6).String()}, ipStrings(r.Addrs()))
	for _, l := range e.hostLinks() {
		if l.Attrs().Name == name {
			require.Equal(t, veth.Alias("unnamed", "eth0", "ebpfnet"), l.Attrs().Alias, "STATUS named the pair again")
		}
	}
	mustConnect(t, []*nettest.Pod{keep, p})
	require.NoError(t, e.cni.DelPod(list, p))
	require.NoError(t, e.cni.DelPod(list, keep))
	e.requireClean()
}

func ipStrings(ips []net.IP) []string {
	var out []string
	for _, ip := range ips {
		out = append(out, ip.String())
	}
	return out
}

// TestPodGoneWithoutDel: a pod whose network namespace is destroyed
// without a DEL (the kernel removes its veth) is reclaimed by the next
// STATUS, or by an ADD when no STATUS ran for a period: its record, map
// entries and addresses go, and with the node's last pod its node-wide
// hooks. A live pod is never touched, and a record whose pod interface is
// alive in its netns is kept when the call runs in the wrong netns.
func TestPodGoneWithoutDel(t *testing.T) {
	cg := testutil.Cgroup(t)
	for _, by := range []string{"STATUS", "ADD"} {
		t.Run(by, func(t *testing.T) {
			e := newEnv(t)
			list := e.hostPortList("", "", cg, map[string]any{"ipMasq": true})
			alive := e.addPodWith(list, "alive")
			dead, err := e.cni.AddPod(list, "dead", nil)
			require.NoError(t, err)
			deadIPs := ipStrings([]net.IP{dead.IP(4), dead.IP(6)})
			nettest.CloseNetNS(dead.NS)
			require.Eventually(t, func() bool { return len(e.hostLinks()) == 1 }, 5e9, 1e7, "the kernel removed the dead pod's veth")

			switch by {
			case "STATUS":
				require.NoError(t, e.cni.Status(list))
			case "ADD":
				// No STATUS for a period: the next ADD heals.
				require.NoError(t, os.Remove(filepath.Join(e.stateDir, "healed")))
				e.addPod(list, "next")
			}
			held := e.ipamHeld()
			for _, ip := range deadIPs {
				require.NotContains(t, held, ip, "%s: the dead pod's %s is still held", by, ip)
			}
			_, err = node.ReadRecord(e.stateDir, veth.HostName("dead", "eth0"))
			require.ErrorIs(t, err, node.ErrNotFound, "the dead pod's record")
			e.requireConsistent("after " + by)
			mustConnect(t, []*nettest.Pod{alive})
			out, err := nettest.Ping(alive.NS, nettest.WorldIP4, 1)
			require.NoError(t, err, "the live pod is untouched: %s", out)

			// The last pod gone without DEL takes the node-wide hooks along.
			require.NoError(t, e.cni.Del(list, &libcni.RuntimeConf{ContainerID: "next", IfName: "eth0"}))
			nettest.CloseNetNS(alive.NS)
			require.Eventually(t, func() bool { return len(e.hostLinks()) == 0 }, 5e9, 1e7)
			require.NoError(t, e.cni.Status(list))
			e.requireClean()
			require.Zero(t, e.uplinkProgramIDs(), "programs left on the uplink")
			require.Empty(t, e.pinnedLinks(), "cgroup hooks left")
			require.Empty(t, e.ipamHeld(), "addresses left")
		})
	}
}
