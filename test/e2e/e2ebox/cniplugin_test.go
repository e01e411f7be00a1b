package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/conflisttest"
	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/cli"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// TestMain removes the plugins the tests built, and fails the run when its
// tests left a namespace, mount or process behind.
func TestMain(m *testing.M) { testutil.Main(m) }

// TestRecorder: e2e-record chained after ebpf-cni, as istio-cni chains
// itself. ADD gives the pod its addresses and the runtime ebpf-cni's
// result unchanged; each call (ADD, CHECK, STATUS, GC, DEL twice) is one
// log line with the call's environment and the prevResult's addresses.
func TestRecorder(t *testing.T) {
	bin := recorderBinary(t)
	for _, v := range []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			e := newRecordEnv(t, bin)
			list := e.n.List(t, conflisttest.Options{Version: v, Chained: []map[string]any{{"type": "e2e-record", "log": e.log}}})
			p := testutil.AddPod(t, e.n.CNI, list, "rec-a")
			require.NotNil(t, p.IP(4))
			require.NotNil(t, p.IP(6))
			out, err := nettest.Ping(p.NS, nettest.NodeIP4, 1)
			require.NoError(t, err, "the pod's address works: %s", out)

			lines := readLog(t, e.log)
			require.Len(t, lines, 1)
			lines[0].requireCall(t, "ADD", list, p.RT)
			require.ElementsMatch(t, podCIDRs(p), lines[0].strings(t, "ips"))
			// ebpf-cni's result (the recorder's prevResult) is the one
			// the runtime got and keeps.
			got, err := e.n.CNI.Config.GetNetworkListCachedResult(list, p.RT)
			require.NoError(t, err)
			requireSameResult(t, lines[0]["prevResult"], got)

			want := []string{"ADD"}
			if testutil.AtLeast(v, "0.4.0") {
				require.NoError(t, e.n.CNI.Check(list, p.RT))
				want = append(want, "CHECK")
			}
			if testutil.AtLeast(v, "1.1.0") {
				require.NoError(t, e.n.CNI.Status(list))
				valid := []types.GCAttachment{{ContainerID: "rec-a", IfName: "eth0"}}
				require.NoError(t, e.n.CNI.GC(list, valid))
				want = append(want, "STATUS", "GC")
				out, err := nettest.Ping(p.NS, nettest.NodeIP4, 1)
				require.NoError(t, err, "the pod survives GC: %s", out)
			}
			require.NoError(t, e.n.CNI.Del(list, p.RT))
			require.NoError(t, e.n.CNI.Del(list, p.RT))
			want = append(want, "DEL", "DEL")
			e.requireNoEndpoints(t)

			lines = readLog(t, e.log)
			require.Equal(t, want, commands(t, lines))
			for i, l := range lines {
				switch want[i] {
				case "STATUS", "GC":
					require.Equal(t, list.Name, l.str(t, "name"))
					require.Equal(t, v, l.str(t, "cniVersion"))
				default:
					l.requireCall(t, want[i], list, p.RT)
				}
				require.NotContains(t, l, "error")
			}
			if testutil.AtLeast(v, "0.4.0") {
				check := lines[1]
				require.ElementsMatch(t, podCIDRs(p), check.strings(t, "ips"))
				requireSameResult(t, check["prevResult"], got)
				// The first DEL has the cached result, the second none.
				require.ElementsMatch(t, podCIDRs(p), lines[len(lines)-2].strings(t, "ips"))
			}
			require.NotContains(t, lines[len(lines)-1], "ips")
			if testutil.AtLeast(v, "1.1.0") {
				require.JSONEq(t, `[{"containerID":"rec-a","ifname":"eth0"}]`, string(lines[3]["validAttachments"]))
			}
		})
	}
}

// TestRecorderWithoutPrevResult: a recorder first in its conflist gets no
// prevResult on ADD and refuses with 7, "invalid network config"; the
// refused call is logged too.
func TestRecorderWithoutPrevResult(t *testing.T) {
	bin := recorderBinary(t)
	for _, v := range []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			log := filepath.Join(t.TempDir(), "calls.log")
			conf := fmt.Sprintf(`{"cniVersion":%q,"name":"alone","type":"e2e-record","log":%q}`, v, log)
			pod := testutil.NetNS(t)
			out := testutil.Run(t, bin, testutil.Call{Command: "ADD", ContainerID: "rec-alone", NetNS: pod.Path(), IfName: "eth0",
				Path: filepath.Dir(bin), Stdin: []byte(conf)})
			cniErr := out.Error(t)
			require.Equal(t, types.ErrInvalidNetworkConfig, cniErr.Code, "%+v", cniErr)
			require.Contains(t, cniErr.Msg, "without prevResult")
			lines := readLog(t, log)
			require.Len(t, lines, 1)
			require.Equal(t, "ADD", lines[0].str(t, "command"))
			require.Equal(t, cniErr.Msg, lines[0].str(t, "error"))
		})
	}
}

// TestDelegator: e2e-record alone in a conflist, delegating to ebpf-cni's
// (Multus's way). Through it the pods get working addresses, the pod's
// CNI_ARGS and capability arguments (mac) reach ebpf-cni, the runtime gets
// ebpf-cni's result, GC keeps the valid attachment and removes the other,
// and DEL leaves ebpf-cni nothing (no endpoint, no address held).
func TestDelegator(t *testing.T) {
	bin := recorderBinary(t)
	for _, v := range []string{"1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			e := newRecordEnv(t, bin)
			inner := e.n.List(t, conflisttest.Options{Version: v, Capabilities: []string{"mac"}})
			delegate := writeList(t, inner)
			cacheDir := t.TempDir()
			list := delegatingList(t, v, e.log, delegate, cacheDir)

			macs := map[string]string{"del-a": "0e:00:00:00:00:0a", "del-b": "0e:00:00:00:00:0b"}
			pods := map[string]*nettest.Pod{}
			for _, id := range []string{"del-a", "del-b"} {
				pods[id] = testutil.AddPodArgs(t, e.n.CNI, list, id, map[string]any{"mac": macs[id]}, testutil.K8sArgs("default", id, "uid-"+id))
			}
			a, b := pods["del-a"], pods["del-b"]
			for _, pair := range [][2]*nettest.Pod{{a, b}, {b, a}} {
				for _, fam := range []int{4, 6} {
					ip := pair[1].IP(fam)
					require.NotNil(t, ip)
					out, err := nettest.Ping(pair[0].NS, ip, 2)
					require.NoError(t, err, "ping %s: %s", ip, out)
					require.NoError(t, nettest.TCP(pair[0].NS, pair[1].NS, ip), "tcp %s", ip)
				}
			}

			// The runtime's result is ebpf-cni's, as the delegator's libcni cached it.
			inCache := libcni.NewCNIConfigWithCacheDir(nil, cacheDir, nil)
			for _, p := range pods {
				got, err := e.n.CNI.Config.GetNetworkListCachedResult(list, p.RT)
				require.NoError(t, err)
				want, err := inCache.GetNetworkListCachedResult(inner, p.RT)
				require.NoError(t, err)
				require.NotNil(t, want, "no result of ebpf-cni cached in the delegator's cacheDir")
				wantJSON, err := json.Marshal(want)
				require.NoError(t, err)
				requireSameResult(t, wantJSON, got)
			}
			eps := e.endpoints(t)
			require.Len(t, eps, 2)
			for _, ep := range eps {
				p := pods[ep.ContainerID]
				require.NotNil(t, p, "endpoint %s", ep.ContainerID)
				require.Equal(t, inner.Name, ep.Network)
				require.Equal(t, &node.Pod{Namespace: "default", Name: ep.ContainerID, UID: "uid-" + ep.ContainerID}, ep.Pod, "CNI_ARGS passed on")
				require.Equal(t, macs[ep.ContainerID], ep.MAC, "the mac capability passed on")
				require.ElementsMatch(t, []string{p.IP(4).String(), p.IP(6).String()}, ep.IPs)
			}

			require.NoError(t, e.n.CNI.Check(list, a.RT))
			// GC with del-a valid: the runtime's libcni deletes del-b
			// (through the delegator), and the delegator's GC, handed the
			// valid attachments, keeps del-a.
			require.NoError(t, e.n.CNI.GC(list, []types.GCAttachment{{ContainerID: "del-a", IfName: "eth0"}}))
			eps = e.endpoints(t)
			require.Len(t, eps, 1)
			require.Equal(t, "del-a", eps[0].ContainerID)
			out, err := nettest.Ping(a.NS, nettest.NodeIP4, 1)
			require.NoError(t, err, "del-a survives GC: %s", out)

			require.NoError(t, e.n.CNI.Del(list, a.RT))
			require.NoError(t, e.n.CNI.Del(list, a.RT))
			e.requireNoEndpoints(t)

			want := []string{"ADD", "ADD", "CHECK", "DEL"}
			if testutil.AtLeast(v, "1.1.0") {
				want = append(want, "GC") // a 1.0.0 runtime deletes the stale attachment only
			}
			want = append(want, "DEL", "DEL")
			lines := readLog(t, e.log)
			require.Equal(t, want, commands(t, lines))
			for _, l := range lines {
				require.Equal(t, delegate, l.str(t, "delegate"))
				require.Equal(t, list.Name, l.str(t, "name"))
				require.NotContains(t, l, "error")
			}
			require.Equal(t, "del-a", lines[0].str(t, "containerID"))
			require.Equal(t, a.NS.Path(), lines[0].str(t, "netns"))
			require.ElementsMatch(t, podCIDRs(a), lines[0].strings(t, "resultIPs"), "ADD's result, the delegate's")
			require.ElementsMatch(t, podCIDRs(a), lines[2].strings(t, "ips"), "CHECK's prevResult")
		})
	}
}

// TestDelegatorStatus: a runtime's STATUS goes through the delegator to
// the delegate's plugins: it succeeds while ebpf-cni's would, fails with
// ebpf-cni's 50 when ebpf-cni's does (bpfRoot no bpffs; libcni asks the
// plugins of a 1.1.0 conflist only), and fails with 50 naming the file when
// the delegate conflist is gone.
func TestDelegatorStatus(t *testing.T) {
	bin := recorderBinary(t)
	for _, v := range []string{"1.0.0", "1.1.0"} { // the delegate's; the runtime's conflist is 1.1.0
		t.Run(v, func(t *testing.T) {
			e := newRecordEnv(t, bin)
			delegate := writeList(t, e.n.List(t, conflisttest.Options{Version: v}))
			list := delegatingList(t, "1.1.0", e.log, delegate, t.TempDir())
			require.NoError(t, e.n.CNI.Status(list))

			broken := writeList(t, e.n.List(t, conflisttest.Options{Version: v, Keys: map[string]any{"bpfRoot": t.TempDir()}}))
			err := e.n.CNI.Status(delegatingList(t, "1.1.0", e.log, broken, t.TempDir()))
			if testutil.AtLeast(v, "1.1.0") {
				requireCNIError(t, err, types.ErrPluginNotAvailable, "bpfRoot unusable")
			} else {
				require.NoError(t, err, "libcni sends STATUS to no plugin of a %s conflist", v)
			}

			require.NoError(t, os.Remove(delegate))
			requireCNIError(t, e.n.CNI.Status(list), types.ErrPluginNotAvailable, delegate)

			lines := readLog(t, e.log)
			require.Equal(t, []string{"STATUS", "STATUS", "STATUS"}, commands(t, lines))
			require.Contains(t, lines[2].str(t, "error"), "no such file")
		})
	}
}

// TestAppendRecordConcurrent: calls writing at once leave whole lines, none
// lost.
func TestAppendRecordConcurrent(t *testing.T) {
	log := filepath.Join(t.TempDir(), "sub", "calls.log")
	big, err := json.Marshal(map[string]string{"pad": strings.Repeat("x", 128<<10)})
	require.NoError(t, err)
	const writers, each = 8, 20
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				errs <- appendRecord(log, record{Command: "ADD", ContainerID: fmt.Sprintf("w%d-%d", w, i), PrevResult: big})
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	lines := readLog(t, log)
	require.Equal(t, writers*each, len(lines), "lines in the log")
	seen := map[string]bool{}
	for _, l := range lines {
		seen[l.str(t, "containerID")] = true
		require.True(t, bytes.Equal(big, l["prevResult"]), "prevResult of %s changed", l.str(t, "containerID"))
	}
	require.Equal(t, writers*each, len(seen), "calls in the log")
}

// recorderBinary builds e2ebox (static, as make e2e does) as e2e-record
// into a directory of the test.
func recorderBinary(t *testing.T) string {
	return testutil.Binary(t, "./test/e2e/e2ebox", "e2e-record")
}

// recordEnv is a simulated node whose CNI_PATH has e2e-record after
// ebpf-cni's plugins, and the log its e2e-record calls write.
type recordEnv struct {
	n   *testutil.Node
	log string
}

func newRecordEnv(t *testing.T, bin string) *recordEnv {
	t.Helper()
	n := testutil.NewNode(t, false)
	n.Paths = append(slices.Clone(n.Paths), filepath.Dir(bin))
	n.CNI = nettest.NewCNI(n.Node, n.Paths, n.CacheDir)
	return &recordEnv{n: n, log: filepath.Join(t.TempDir(), "calls.log")}
}

// cliJSON runs the ebpf-cni CLI in the node on the node's state, -o json.
func (e *recordEnv) cliJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	require.NoError(t, e.n.NS.Do(func(ns.NetNS) error {
		cmd := exec.Command(filepath.Join(e.n.Paths[0], "ebpf-cni"), append(args, "-o", "json", "--bpf-root", e.n.BPFRoot, "--state-dir", e.n.StateDir)...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // no CNI_COMMAND: the CLI
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		return cmd.Run()
	}), "ebpf-cni %s: %s", args, stderr.String())
	require.NoError(t, json.Unmarshal(stdout.Bytes(), v), "%s", stdout.String())
}

func (e *recordEnv) endpoints(t *testing.T) []cli.Endpoint {
	t.Helper()
	var eps []cli.Endpoint
	e.cliJSON(t, &eps, "endpoints")
	return eps
}

// requireNoEndpoints: ebpf-cni has no endpoint and ebpf-ipam holds no
// address, as make e2e checks them on a node.
func (e *recordEnv) requireNoEndpoints(t *testing.T) {
	t.Helper()
	require.Empty(t, e.endpoints(t), "ebpf-cni endpoints")
	var nets []cli.NetworkAllocations
	e.cliJSON(t, &nets, "ipam")
	for _, n := range nets {
		require.Empty(t, n.Allocations, "ebpf-cni ipam: network %s", n.Network)
	}
}

// writeList writes a conflist into a directory of the test, as a
// delegate's file.
func writeList(t *testing.T, list *libcni.NetworkConfigList) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "10-ebpf-cni.conflist")
	require.NoError(t, os.WriteFile(path, list.Bytes, 0o644))
	return path
}

// delegatingList is the conflist of a delegator: e2e-record alone, running
// the conflist at delegate, with its libcni cache in cacheDir (never the
// machine's /var/lib/cni) and the mac capability to pass on.
func delegatingList(t *testing.T, v, log, delegate, cacheDir string) *libcni.NetworkConfigList {
	t.Helper()
	b, err := json.Marshal(map[string]any{"cniVersion": v, "name": "e2e-delegate", "plugins": []any{map[string]any{
		"type": "e2e-record", "log": log, "delegate": delegate, "cacheDir": cacheDir, "capabilities": map[string]any{"mac": true}}}})
	require.NoError(t, err)
	list, err := libcni.ConfListFromBytes(b)
	require.NoError(t, err)
	return list
}

// logLine is one line of the log, by the field names make e2e reads.
type logLine map[string]json.RawMessage

func readLog(t *testing.T, path string) []logLine {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var out []logLine
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var l logLine
		require.NoError(t, json.Unmarshal(sc.Bytes(), &l), "log line %d: %.200q", len(out)+1, sc.Text())
		out = append(out, l)
	}
	require.NoError(t, sc.Err())
	return out
}

func (l logLine) str(t *testing.T, key string) string {
	t.Helper()
	var s string
	require.Contains(t, l, key)
	require.NoError(t, json.Unmarshal(l[key], &s), "%s", key)
	return s
}

func (l logLine) strings(t *testing.T, key string) []string {
	t.Helper()
	var s []string
	require.Contains(t, l, key)
	require.NoError(t, json.Unmarshal(l[key], &s), "%s", key)
	return s
}

// requireCall checks the fields every call of an attachment has.
func (l logLine) requireCall(t *testing.T, command string, list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) {
	t.Helper()
	require.NotEmpty(t, l.str(t, "time"))
	require.Equal(t, command, l.str(t, "command"))
	require.Equal(t, rt.ContainerID, l.str(t, "containerID"))
	require.Equal(t, rt.NetNS, l.str(t, "netns"))
	require.Equal(t, rt.IfName, l.str(t, "ifName"))
	require.Equal(t, list.Name, l.str(t, "name"))
	require.Equal(t, list.CNIVersion, l.str(t, "cniVersion"))
}

func commands(t *testing.T, lines []logLine) []string {
	t.Helper()
	var out []string
	for _, l := range lines {
		out = append(out, l.str(t, "command"))
	}
	return out
}

func podCIDRs(p *nettest.Pod) []string {
	var out []string
	for _, ip := range p.Result.IPs {
		out = append(out, ip.Address.String())
	}
	return out
}

// requireSameResult: got, as libcni holds it, is the result raw was.
func requireSameResult(t *testing.T, raw json.RawMessage, got types.Result) {
	t.Helper()
	require.NotEmpty(t, raw)
	b, err := json.Marshal(got)
	require.NoError(t, err)
	require.JSONEq(t, string(raw), string(b))
}

func requireCNIError(t *testing.T, err error, code uint, msg string) {
	t.Helper()
	var te *types.Error
	require.True(t, errors.As(err, &te), "want CNI error %d, got %v", code, err)
	require.Equal(t, code, te.Code, "%v", err)
	require.Contains(t, te.Msg, msg)
}
