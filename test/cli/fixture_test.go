// Package cli_test runs the built ebpf-cni binary as an operator would, in a
// simulated node (network namespaces, private bpffs) whose pods are attached
// through the real plugins with libcni.
package cli_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/conflisttest"
	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/cli"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// env is one simulated node with the plugins and the CLI ready to run in it.
type env struct {
	t        *testing.T
	node     *nettest.Node
	cni      *nettest.CNI
	bpfRoot  string
	stateDir string
	bin      string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	n := testutil.NewNode(t, false)
	return &env{t: t, node: n.Node, cni: n.CNI, bpfRoot: n.BPFRoot, stateDir: n.StateDir, bin: filepath.Join(n.Paths[0], "ebpf-cni")}
}

// confList is a dual-stack network of ebpf-cni with ebpf-ipam.
func (e *env) confList(mode string) *libcni.NetworkConfigList {
	e.t.Helper()
	return conflisttest.List(e.t, conflisttest.Options{Name: "clinet", BPFRoot: e.bpfRoot, StateDir: e.stateDir, AttachMode: mode})
}

// addPod attaches a pod, deleted at cleanup.
func (e *env) addPod(list *libcni.NetworkConfigList, id string) *nettest.Pod {
	e.t.Helper()
	return testutil.AddPod(e.t, e.cni, list, id)
}

// result is one CLI run.
type result struct {
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// runIn runs the CLI binary in netns n as a person would: no CNI_COMMAND.
func runIn(t *testing.T, n ns.NetNS, bin string, args ...string) result {
	t.Helper()
	var r result
	do := func() error {
		cmd := exec.Command(bin, args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		r = result{stdout: stdout.String(), stderr: stderr.String()}
		if ee, ok := err.(*exec.ExitError); ok {
			r.code = ee.ExitCode()
			return nil
		}
		return err
	}
	if n == nil {
		require.NoError(t, do())
	} else {
		require.NoError(t, n.Do(func(ns.NetNS) error { return do() }))
	}
	return r
}

// cli runs a command in the node with the env's bpfRoot and stateDir.
func (e *env) cli(args ...string) result {
	e.t.Helper()
	return runIn(e.t, e.node.NS, e.bin, append(args, "--bpf-root", e.bpfRoot, "--state-dir", e.stateDir)...)
}

// json runs a command with -o json, requires exit code want and decodes
// stdout into v.
func (e *env) json(v any, want int, args ...string) {
	e.t.Helper()
	r := e.cli(append(args, "-o", "json")...)
	require.Equal(e.t, want, r.code, "%s", r)
	require.NoError(e.t, json.Unmarshal([]byte(r.stdout), v), "%s", r)
}

func (e *env) endpoints() []cli.Endpoint {
	e.t.Helper()
	var eps []cli.Endpoint
	e.json(&eps, cli.ExitOK, "endpoints")
	return eps
}

func (e *env) counters() countersJSON {
	e.t.Helper()
	var c countersJSON
	e.json(&c, cli.ExitOK, "counters")
	return c
}

// countersJSON is the counters output as a script reads it.
type countersJSON struct {
	Total     cli.ReasonCounters      `json:"total"`
	Endpoints []*cli.EndpointCounters `json:"endpoints"`
}

func (c countersJSON) of(containerID string) *cli.EndpointCounters {
	for _, e := range c.Endpoints {
		if e.ContainerID == containerID {
			return e
		}
	}
	return &cli.EndpointCounters{ReasonCounters: cli.ReasonCounters{Reasons: map[string]cli.CounterValue{}}}
}

// eventually polls cond for up to 10 s (the kernel tears a netns down
// asynchronously).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }

// handle is a handle on the test's node as a call opens it, without the
// node lock (the test reads and writes maps beside the calls it makes);
// the caller closes it.
func (e *env) handle() *node.Node {
	e.t.Helper()
	n, err := node.Open(node.Options{BPFRoot: e.bpfRoot, StateDir: e.stateDir, Lock: node.Unlocked})
	require.NoError(e.t, err)
	return n
}
