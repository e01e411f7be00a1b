package cli_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/cli"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// TestGCLeftovers: gc removes map entries no endpoint accounts for, but not
// those of a live pod that lost its record, from the node's netns or from
// another one. endpoint_pods included: a ghost's identity, and one without
// a device entry (an ADD killed between the two writes).
func TestGCLeftovers(t *testing.T) {
	e := newEnv(t)
	list := e.confList(testutil.BestMode())
	a := e.addPod(list, "pod-a")
	b := e.addPod(list, "pod-b")
	bVeth := b.Result.Interfaces[0].Name
	require.NoError(t, os.Remove(filepath.Join(e.stateDir, "endpoints", bVeth+".json")), "pod-b loses its record")

	nd := e.handle()
	defer nd.Close()
	em, err := endpoint.MapsOf(nd)
	require.NoError(t, err)
	require.NoError(t, em.Put(&endpoint.Entry{HostIfIndex: 9999, HostMAC: net.HardwareAddr{0x0e, 0, 0, 0, 0x99, 0x99},
		MAC: net.HardwareAddr{0x0e, 0, 0, 0, 0x99, 0x98}, IPs: []net.IP{net.ParseIP("10.244.1.199")}, ContainerID: "ghost", IfName: "eth0",
		Pod: &endpoint.Pod{Namespace: "ns", Name: "ghost-pod"}}))
	halfPod := endpoint.Pod{Namespace: "ns", Name: "half-added"}
	require.NoError(t, em.Pods.Put(uint32(9998), podValue(halfPod)))
	bIndex := -1
	for _, ep := range e.endpoints() {
		if ep.HostVeth == bVeth {
			bIndex = ep.HostIfIndex
		}
	}
	require.NoError(t, em.Pods.Put(uint32(bIndex), podValue(endpoint.Pod{Namespace: "ns", Name: "pod-b"})))

	other, err := nettest.NewNetNS()
	require.NoError(t, err)
	t.Cleanup(func() { nettest.CloseNetNS(other) })
	for _, where := range []string{"other netns", "node"} {
		var r result
		if where == "node" {
			r = e.cli("gc", "-o", "json")
		} else {
			r = runIn(t, other, e.bin, "gc", "--bpf-root", e.bpfRoot, "--state-dir", e.stateDir, "-o", "json")
		}
		require.Equal(t, cli.ExitOK, r.code, "%s: %s", where, r)
		var g gcJSON
		require.NoError(t, jsonUnmarshal(r.stdout, &g))
		require.Empty(t, g.Endpoints, where)
		all := strings.Join(g.Leftovers, "\n")
		require.NotContains(t, all, "pod-b", "%s: gc swept the entries of a live pod", where)
		if where == "other netns" {
			require.Contains(t, all, "ghost", where)
			require.Contains(t, all, "endpoint_pods[9998] (pod ns/half-added)", where)
		}
		out, err := nettest.Ping(a.NS, b.IP(4), 1)
		require.NoError(t, err, "%s: %s", where, out)
	}
	devs, err := em.Devices()
	require.NoError(t, err)
	require.Len(t, devs, 2, "the ghost entry is gone, both pods' stay")
	pods, err := endpoint.ReadPods(em.Pods)
	require.NoError(t, err)
	require.Equal(t, map[uint32]endpoint.Pod{uint32(bIndex): {Namespace: "ns", Name: "pod-b"}}, pods, "the ghosts' identities are gone, pod-b's stays")
}

func podValue(p endpoint.Pod) *maps.CniEndpointPod {
	var v maps.CniEndpointPod
	maps.CString(v.Namespace[:], p.Namespace)
	maps.CString(v.Name[:], p.Name)
	return &v
}
