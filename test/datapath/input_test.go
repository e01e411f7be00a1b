package datapath_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/conflisttest"
	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

// pluginConf is the ebpf-cni entry of the test's list as the runtime hands
// it to the plugin (name and cniVersion added), with prev as prevResult
// unless nil.
func (e *env) pluginConf(ver string, prev any) []byte {
	e.t.Helper()
	conf := conflisttest.Plugin(conflisttest.Options{Version: ver, BPFRoot: e.bpfRoot, StateDir: e.stateDir})
	conf["name"], conf["cniVersion"] = conflisttest.DefaultName, ver
	if prev != nil {
		conf["prevResult"] = prev
	}
	b, err := json.Marshal(conf)
	require.NoError(e.t, err)
	return b
}

// runPlugin runs ebpf-cni in the node netns through the exec protocol.
func (e *env) runPlugin(c testutil.Call) *testutil.Output {
	e.t.Helper()
	c.Path = testutil.PluginDir(e.t)
	var o *testutil.Output
	require.NoError(e.t, e.node.NS.Do(func(ns.NetNS) error {
		o = testutil.Run(e.t, filepath.Join(c.Path, "ebpf-cni"), c)
		return nil
	}))
	return o
}

// oneDocument decodes stdout as exactly one JSON document: a plugin prints
// its result or its error, never both.
func oneDocument(t *testing.T, stdout []byte) testutil.CNIError {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(stdout))
	var e testutil.CNIError
	require.NoError(t, d.Decode(&e), "stdout: %s", stdout)
	var more json.RawMessage
	require.True(t, errors.Is(d.Decode(&more), io.EOF), "more than one JSON document on stdout: %s", stdout)
	return e
}

// nodeState is what an ADD into the node's own netns would change there:
// links, addresses, routes of both families and policy rules.
func (e *env) nodeState() string {
	e.t.Helper()
	var out string
	for _, args := range [][]string{{"-d", "link", "show"}, {"addr", "show"}, {"-4", "route", "show", "table", "all"},
		{"-6", "route", "show", "table", "all"}, {"-4", "rule", "show"}, {"-6", "rule", "show"}} {
		s, err := nettest.Run(e.node.NS, "ip", args...)
		require.NoError(e.t, err)
		out += s
	}
	return out
}

// TestNodeNetNSRefused: an ADD whose CNI_NETNS names the plugin's own
// network namespace (the node's) is refused before anything is made, with
// code 4 naming CNI_NETNS, and prints that error alone, under every spec
// version; the node keeps its links, addresses, routes and policy rules.
func TestNodeNetNSRefused(t *testing.T) {
	e := newEnv(t)
	// The uplink's carrier comes up a moment after the fixture made it
	// (on a loaded machine, after a first snapshot): wait for it, so that
	// the snapshots compare what the plugin could change.
	require.Eventually(t, func() bool {
		s, err := nettest.Run(e.node.NS, "ip", "link", "show", "uplink")
		return err == nil && !strings.Contains(s, "NO-CARRIER") && strings.Contains(s, "state UP")
	}, 10*time.Second, 20*time.Millisecond, "the node's uplink never got its carrier")
	for _, ver := range testutil.SpecVersions {
		t.Run(ver, func(t *testing.T) {
			before := e.nodeState()
			o := e.runPlugin(testutil.Call{Command: "ADD", ContainerID: "node-itself", NetNS: e.node.NS.Path(), IfName: "eth0",
				Stdin: e.pluginConf(ver, nil)})
			require.NotZero(t, o.ExitCode, "ADD into the node's netns succeeded: %s", o.Stdout)
			ce := oneDocument(t, o.Stdout)
			require.Equal(t, uint(types.ErrInvalidEnvironmentVariables), ce.Code, "%+v", ce)
			require.Contains(t, ce.Msg, "CNI_NETNS")
			require.Contains(t, ce.Msg, "node's own network namespace")
			require.Equal(t, before, e.nodeState(), "the node's network changed")
			e.requireClean()
			require.Empty(t, e.ipamOwners(), "an address was allocated")

			// The runtime cleans up after the failed ADD: DEL succeeds
			// (skel's own check would fail it after the fact, code 8).
			o = e.runPlugin(testutil.Call{Command: "DEL", ContainerID: "node-itself", NetNS: e.node.NS.Path(), IfName: "eth0",
				Stdin: e.pluginConf(ver, nil)})
			require.Zero(t, o.ExitCode, "DEL: %s %s", o.Stdout, o.Stderr)
			require.Empty(t, o.Stdout)
			require.Equal(t, before, e.nodeState(), "DEL changed the node's network")
		})
	}
	// The same namespace by another path is the same namespace.
	o := e.runPlugin(testutil.Call{Command: "ADD", ContainerID: "node-itself", NetNS: "/proc/self/ns/net", IfName: "eth0",
		Stdin: e.pluginConf("1.1.0", nil)})
	ce := oneDocument(t, o.Stdout)
	require.Equal(t, uint(types.ErrInvalidEnvironmentVariables), ce.Code, "%+v", ce)
	e.requireClean()
}

// TestPrevResultInterfaceIndex: a prevResult with an address whose
// interface index points past its interfaces is refused with code 7
// naming prevResult.ips[i].interface: by ADD before anything is made
// (never passed on), and by CHECK; under every spec version that has
// interface indexes (0.3.0 on) and CHECK (0.4.0 on).
func TestPrevResultInterfaceIndex(t *testing.T) {
	e := newEnv(t)
	for _, ver := range testutil.SpecVersions {
		if !testutil.AtLeast(ver, "0.3.0") {
			continue // results without interfaces
		}
		t.Run(ver, func(t *testing.T) {
			for _, idx := range []int{1, 5, -1} {
				ip := map[string]any{"address": "127.0.0.1/8", "interface": idx}
				if !testutil.AtLeast(ver, "1.0.0") {
					ip["version"] = "4"
				}
				prev := map[string]any{"cniVersion": ver, "interfaces": []any{map[string]any{"name": "lo"}}, "ips": []any{ip}}
				pod := testutil.NetNS(t)
				o := e.runPlugin(testutil.Call{Command: "ADD", ContainerID: "bad-index", NetNS: pod.Path(), IfName: "eth0",
					Stdin: e.pluginConf(ver, prev)})
				ce := oneDocument(t, o.Stdout)
				require.Equal(t, uint(types.ErrInvalidNetworkConfig), ce.Code, "interface %d: %+v", idx, ce)
				require.Contains(t, ce.Msg, "prevResult.ips[0].interface")
				e.requireClean()
				require.Empty(t, e.ipamOwners(), "an address was allocated")
			}
			if !testutil.AtLeast(ver, "0.4.0") {
				return // no CHECK
			}
			list := e.confList(netOpts{version: ver})
			p := e.addPod(list, "check-index")
			require.NoError(t, e.cni.Check(list, p.RT))
			r, err := p.Result.GetAsVersion(ver)
			require.NoError(t, err)
			b, err := json.Marshal(r)
			require.NoError(t, err)
			var prev map[string]any
			require.NoError(t, json.Unmarshal(b, &prev))
			ips := prev["ips"].([]any)
			ips[len(ips)-1].(map[string]any)["interface"] = len(prev["interfaces"].([]any))
			o := e.runPlugin(testutil.Call{Command: "CHECK", ContainerID: "check-index", NetNS: p.RT.NetNS, IfName: "eth0",
				Stdin: e.pluginConf(ver, prev)})
			ce := oneDocument(t, o.Stdout)
			require.Equal(t, uint(types.ErrInvalidNetworkConfig), ce.Code, "%+v", ce)
			require.Contains(t, ce.Msg, "prevResult.ips[1].interface")
			require.NoError(t, e.cni.Check(list, p.RT), "the pod is unchanged")
			require.NoError(t, e.cni.DelPod(list, p))
			e.requireClean()
		})
	}
}
