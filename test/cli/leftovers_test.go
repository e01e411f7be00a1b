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
)

// TestGCLeftovers: gc removes map entries no endpoint accounts for, but not
// those of a live pod that lost its record, from the node's netns or from
// another one.
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
		MAC: net.HardwareAddr{0x0e, 0, 0, 0, 0x99, 0x98}, IPs: []net.IP{net.ParseIP("10.244.1.199")}, ContainerID: "ghost", IfName: "eth0"}))

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
		}
		out, err := nettest.Ping(a.NS, b.IP(4), 1)
		require.NoError(t, err, "%s: %s", where, out)
	}
	devs, err := em.Devices()
	require.NoError(t, err)
	require.Len(t, devs, 2, "the ghost entry is gone, both pods' stay")
}
