package datapath_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/plugin"
)

var timingLine = regexp.MustCompile(`^ebpf-cni (ADD|DEL) \S+/eth0 total=[0-9.]+( [a-zA-Z_-]+=[0-9.]+)+ outcome=(ok|error)$`)

// TestTimingSwitch: with EBPF_CNI_TIMING naming a file, every ADD and DEL
// appends one line of its phases there (the result on stdout is
// untouched); with "stderr" the line goes to stderr; without it nothing is
// written.
func TestTimingSwitch(t *testing.T) {
	e := newEnv(t)
	list := e.confList(netOpts{})
	p := e.addPod(list, "untimed")
	require.NoError(t, e.cni.DelPod(list, p))

	log := filepath.Join(t.TempDir(), "timing.log")
	t.Setenv(plugin.TimingEnv, log) // libcni passes its environment on
	p = e.addPod(list, "timed")
	require.NoError(t, e.cni.DelPod(list, p))
	b, err := os.ReadFile(log)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	require.Len(t, lines, 2, "one line per call: %s", b)
	for i, verb := range []string{"ADD", "DEL"} {
		require.Regexp(t, timingLine, lines[i])
		require.True(t, strings.HasPrefix(lines[i], "ebpf-cni "+verb+" timed/eth0 "), lines[i])
	}
	for _, phase := range []string{"start", "parse", "netns", "open", "programs", "ipam", "veth", "endpoint", "record", "print"} {
		require.Contains(t, lines[0], " "+phase+"=", "ADD phase %s", phase)
	}
	for _, phase := range []string{"parse", "open", "teardown", "ipam"} {
		require.Contains(t, lines[1], " "+phase+"=", "DEL phase %s", phase)
	}

	// stderr: the exec protocol, stdout still only the result.
	t.Setenv(plugin.TimingEnv, "")
	n := testutil.NetNS(t)
	conf, err := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "ebpfnet", "type": "ebpf-cni",
		"bpfRoot": e.bpfRoot, "stateDir": e.stateDir, "ipam": map[string]any{"type": "ebpf-ipam", "subnet": "10.244.1.0/24"}})
	require.NoError(t, err)
	call := testutil.Call{ContainerID: "stderr", NetNS: n.Path(), IfName: "eth0", Path: testutil.PluginDir(t),
		Env: []string{plugin.TimingEnv + "=stderr"}, Stdin: conf}
	for _, verb := range []string{"ADD", "DEL"} {
		call.Command = verb
		var o *testutil.Output
		require.NoError(t, e.node.NS.Do(func(ns.NetNS) error {
			o = testutil.Run(t, filepath.Join(testutil.PluginDir(t), "ebpf-cni"), call).Must(t)
			return nil
		}))
		require.Regexp(t, timingLine, strings.TrimSpace(string(o.Stderr)))
		if verb == "ADD" {
			var r map[string]any
			require.NoError(t, json.Unmarshal(o.Stdout, &r), "stdout is the result alone: %s", o.Stdout)
		}
	}
	_, err = os.Stat(log)
	require.NoError(t, err)
	b2, _ := os.ReadFile(log)
	require.Equal(t, b, b2, "with the switch off nothing more was written")
	e.requireClean()
}
