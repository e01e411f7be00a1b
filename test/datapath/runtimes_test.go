package datapath_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/internal/conflisttest"
	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

// listWithFirst is the test's network with first before ebpf-cni.
func (e *env) listWithFirst(o netOpts, first map[string]any) *libcni.NetworkConfigList {
	e.t.Helper()
	b, err := conflisttest.Bytes(conflisttest.Options{Name: o.name, Version: o.version, BPFRoot: e.bpfRoot, StateDir: e.stateDir,
		IPAM: o.ipam, Keys: o.extra})
	require.NoError(e.t, err)
	var raw map[string]any
	require.NoError(e.t, json.Unmarshal(b, &raw))
	raw["plugins"] = append([]any{first}, raw["plugins"].([]any)...)
	b, err = json.Marshal(raw)
	require.NoError(e.t, err)
	list, err := libcni.ConfListFromBytes(b)
	require.NoError(e.t, err)
	return list
}

// TestPrevResult: with loopback first in the list, the final result holds
// lo and its addresses, and the pod's interface and addresses after them
// (the spec: a plugin passes the previous result on). A prevResult that is
// not a result is a decoding error (code 6) before anything is made.
func TestPrevResult(t *testing.T) {
	for _, ver := range testutil.SpecVersions {
		if !testutil.AtLeast(ver, "0.3.0") {
			continue // results without interfaces: nothing to chain
		}
		t.Run(ver, func(t *testing.T) {
			e := newEnv(t)
			list := e.listWithFirst(netOpts{version: ver}, map[string]any{"type": "loopback"})
			p := e.addPod(list, "chained")
			r := p.Result
			require.GreaterOrEqual(t, len(r.Interfaces), 3, "%+v", r.Interfaces)
			require.Equal(t, "lo", r.Interfaces[0].Name, "loopback's interface comes first")
			podIP := r.IPs[len(r.IPs)-2].Address.IP // ebpf-cni's IPv4 address, after lo's
			require.NotNil(t, podIP.To4())
			require.False(t, podIP.IsLoopback())
			var lo, pod bool
			for _, ipc := range r.IPs {
				require.NotNil(t, ipc.Interface)
				name := r.Interfaces[*ipc.Interface].Name
				switch {
				case ipc.Address.IP.IsLoopback():
					lo = true
					require.Equal(t, "lo", name)
				case ipc.Address.IP.Equal(podIP):
					pod = true
					require.Equal(t, "eth0", name, "the pod's address points at its interface")
				}
			}
			require.True(t, lo, "lo's address kept: %v", r.IPs)
			require.True(t, pod, "the pod's address: %v", r.IPs)
			out, err := nettest.Ping(p.NS, nettest.NodeIP4, 1)
			require.NoError(t, err, "%s", out)
			if testutil.AtLeast(ver, "0.4.0") {
				require.NoError(t, e.cni.Check(list, p.RT), "CHECK accepts the chained result")
			}

			// Malformed prevResult, through the exec protocol.
			n := testutil.NetNS(t)
			conf, err := json.Marshal(map[string]any{"cniVersion": ver, "name": "ebpfnet", "type": "ebpf-cni",
				"bpfRoot": e.bpfRoot, "stateDir": e.stateDir, "prevResult": map[string]any{"cniVersion": ver, "ips": "not a list"},
				"ipam": map[string]any{"type": "ebpf-ipam", "subnet": "10.244.1.0/24"}})
			require.NoError(t, err)
			var o *testutil.Output
			require.NoError(t, e.node.NS.Do(func(ns.NetNS) error {
				o = testutil.Run(t, filepath.Join(testutil.PluginDir(t), "ebpf-cni"), testutil.Call{Command: "ADD", ContainerID: "bad-prev",
					NetNS: n.Path(), IfName: "eth0", Path: testutil.PluginDir(t), Stdin: conf})
				return nil
			}))
			ce := o.Error(t)
			require.Equal(t, uint(types.ErrDecodingFailure), ce.Code, "%+v", ce)
			require.Contains(t, ce.Msg, "prevResult")
			require.NoError(t, e.cni.DelPod(list, p))
			e.requireClean()
			require.Empty(t, e.ipamOwners())
		})
	}
}

// TestSecondNetwork: a pod that has a default route from a first network
// gets a second network from ebpf-cni, and a second ebpf-cni interface of
// the same network; the existing default and subnet routes are kept (not
// an error), and every address answers.
func TestSecondNetwork(t *testing.T) {
	for _, ver := range []string{"0.4.0", "1.0.0", "1.1.0"} {
		t.Run(ver, func(t *testing.T) {
			e := newEnv(t)
			first := e.confList(netOpts{version: ver})
			second := e.confList(netOpts{version: ver, name: "second", ipam: map[string]any{"type": "ebpf-ipam",
				"ranges": []any{[]any{map[string]any{"subnet": "10.246.0.0/24"}}, []any{map[string]any{"subnet": "fd00:246::/64"}}}}})
			p := e.addPod(first, "multi")
			peer := e.addPod(first, "peer")
			attach := func(list *libcni.NetworkConfigList, ifName string) *types100.Result {
				rt := &libcni.RuntimeConf{ContainerID: "multi", NetNS: p.RT.NetNS, IfName: ifName}
				res, err := e.cni.Add(list, rt)
				require.NoError(t, err, "ADD %s", ifName)
				t.Cleanup(func() { _ = e.cni.Del(list, rt) })
				return res
			}
			other := attach(second, "net1")
			same := attach(first, "net2")
			for _, res := range []*types100.Result{other, same} {
				for _, r := range res.Routes {
					ones, _ := r.Dst.Mask.Size()
					require.NotZero(t, ones, "the pod's default route stays the first network's: %v", res.Routes)
				}
			}
			require.NoError(t, p.NS.Do(func(ns.NetNS) error {
				routes, err := netlink.RouteList(nil, unix.AF_INET)
				require.NoError(t, err)
				defaults := 0
				for _, r := range routes {
					if r.Dst == nil || r.Dst.IP.IsUnspecified() {
						defaults++
					}
				}
				require.Equal(t, 1, defaults, "one default route: %v", routes)
				return nil
			}))
			for _, res := range []*types100.Result{p.Result, other, same} {
				for _, ipc := range res.IPs {
					if ipc.Address.IP.IsLoopback() {
						continue
					}
					fam := 4
					if ipc.Address.IP.To4() == nil {
						fam = 6
					}
					out, err := nettest.Ping(e.node.NS, ipc.Address.IP, 1)
					require.NoError(t, err, "node to %s: %s", ipc.Address.IP, out)
					if fam == 4 {
						out, err = nettest.Ping(peer.NS, ipc.Address.IP, 1)
						require.NoError(t, err, "another pod to %s: %s", ipc.Address.IP, out)
					}
				}
			}
			require.NoError(t, e.cni.Del(second, &libcni.RuntimeConf{ContainerID: "multi", NetNS: p.RT.NetNS, IfName: "net1"}))
			require.NoError(t, e.cni.Del(first, &libcni.RuntimeConf{ContainerID: "multi", NetNS: p.RT.NetNS, IfName: "net2"}))
			out, err := nettest.Ping(e.node.NS, p.IP(4), 1)
			require.NoError(t, err, "the first interface still answers: %s", out)
			// The second interfaces' source rules went with them.
			require.NoError(t, p.NS.Do(func(ns.NetNS) error {
				rules, err := netlink.RuleList(netlink.FAMILY_ALL)
				for _, r := range rules {
					require.False(t, r.Priority == 1000 && r.Table >= 1000, "rule left in the pod after DEL: %v", r)
				}
				return err
			}))
		})
	}
}

// TestDelWithoutBPFFS: on a node whose bpffs is not mounted (just
// rebooted), DEL of a pod added before succeeds and removes its veth and
// records; after remounting nothing of it remains and its address is free.
func TestDelWithoutBPFFS(t *testing.T) {
	for _, ver := range testutil.SpecVersions {
		t.Run(ver, func(t *testing.T) {
			e := newEnv(t)
			list := e.confList(netOpts{version: ver})
			p := e.addPod(list, "rebooted")
			ip := p.IP(4)
			mnt := filepath.Dir(e.bpfRoot) // testutil.BPFFS's mount
			remount := func() error {
				var st unix.Statfs_t
				if unix.Statfs(mnt, &st) == nil && st.Type == unix.BPF_FS_MAGIC {
					return nil
				}
				return unix.Mount("bpf", mnt, "bpf", 0, "")
			}
			require.NoError(t, unix.Unmount(mnt, 0))
			t.Cleanup(func() { _ = remount() }) // testutil's cleanup unmounts it
			require.NoError(t, e.cni.DelPod(list, p), "DEL is best effort without bpffs")
			require.Empty(t, e.hostLinks(), "the veth is gone")
			require.Zero(t, e.records(), "the record is gone")
			require.NoError(t, e.cni.DelPod(list, p), "and idempotent")

			require.NoError(t, remount())
			n := testutil.NetNS(t)
			rt := &libcni.RuntimeConf{ContainerID: "next", NetNS: n.Path(), IfName: "eth0", Args: [][2]string{{"IP", ip.String()}}}
			res, err := e.cni.Add(list, rt)
			require.NoError(t, err, "the address is free")
			require.NoError(t, e.cni.Del(list, rt))
			_ = res
			e.requireClean()
			require.Empty(t, e.ipamOwners())
		})
	}
}

// fakeIPAM is an IPAM plugin that runs ebpf-ipam and then does what how
// says for ADD (and for STATUS, DEL when failing): "garbage" prints
// something that is not a result after allocating, "fail" exits with an
// IPAM error (code 11) after allocating.
func fakeIPAM(t *testing.T, how string) string {
	t.Helper()
	dir := t.TempDir()
	script := fmt.Sprintf(`#!/bin/sh
out=$(%s/ebpf-ipam); rc=$?
case "$CNI_COMMAND/%s" in
ADD/garbage) echo '{not json'; exit 0 ;;
ADD/fail|STATUS/fail|DEL/faildel|GC/faildel) echo '{"cniVersion":"1.1.0","code":11,"msg":"fake IPAM failure"}'; exit 1 ;;
esac
echo "$out"; exit $rc
`, testutil.PluginDir(t), how)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "fake-ipam"), []byte(script), 0o755))
	return dir
}

// TestIPAMFailure: an IPAM plugin that allocates and then fails (or prints
// garbage) gets its DEL from ebpf-cni's ADD, so nothing stays allocated;
// its own error passes through (a parse error, which libcni reports with
// code 0, becomes 117); STATUS answers 50 whatever IPAM's code; DEL passes
// IPAM's own error through.
func TestIPAMFailure(t *testing.T) {
	for _, ver := range []string{"0.4.0", "1.0.0", "1.1.0"} {
		t.Run(ver, func(t *testing.T) {
			e := newEnv(t)
			ipamSec := func() map[string]any {
				return map[string]any{"type": "fake-ipam", "bpfRoot": e.bpfRoot, "stateDir": e.stateDir, "subnet": "10.244.1.0/24"}
			}
			for how, code := range map[string]uint{"garbage": 117, "fail": 11} {
				c := nettest.NewCNI(e.node, append([]string{fakeIPAM(t, how)}, e.paths...), t.TempDir())
				list := e.confList(netOpts{version: ver, ipam: ipamSec()})
				_, err := c.AddPod(list, "ipam-"+how, nil)
				require.Error(t, err, how)
				require.Equal(t, code, cniCode(t, err), "%s: %v", how, err)
				require.Empty(t, e.ipamOwners(), "%s: IPAM DEL released the address", how)
				e.requireClean()
				if how == "fail" && testutil.AtLeast(ver, "1.1.0") {
					err := c.Status(list)
					require.Equal(t, uint(types.ErrPluginNotAvailable), cniCode(t, err), "%v", err)
					require.Contains(t, err.Error(), "fake IPAM failure")
				}
			}
			c := nettest.NewCNI(e.node, append([]string{fakeIPAM(t, "faildel")}, e.paths...), t.TempDir())
			list := e.confList(netOpts{version: ver, ipam: ipamSec()})
			p, err := c.AddPod(list, "ipam-del", nil)
			require.NoError(t, err)
			err = c.DelPod(list, p)
			require.Equal(t, uint(11), cniCode(t, err), "IPAM's own error passes through: %v", err)
			if testutil.AtLeast(ver, "1.1.0") {
				err = c.GC(list, nil)
				require.Equal(t, uint(11), cniCode(t, err), "GC passes IPAM's own error through too: %v", err)
			}
			nettest.CloseNetNS(p.NS)
		})
	}
}

// TestResultFieldsPerVersion: the interfaces' mtu (and the routes' 1.1.0
// keys) appear in 1.1.0 results only.
func TestResultFieldsPerVersion(t *testing.T) {
	for _, ver := range testutil.SpecVersions {
		if !testutil.AtLeast(ver, "1.0.0") {
			continue // older results have their own types without these keys
		}
		t.Run(ver, func(t *testing.T) {
			e := newEnv(t)
			list := e.confList(netOpts{version: ver})
			n := testutil.NetNS(t)
			rt := &libcni.RuntimeConf{ContainerID: "fields", NetNS: n.Path(), IfName: "eth0"}
			var res types.Result
			require.NoError(t, e.node.NS.Do(func(ns.NetNS) error {
				var err error
				res, err = e.cni.Config.AddNetworkList(context.Background(), list, rt)
				return err
			}))
			t.Cleanup(func() { _ = e.cni.Del(list, rt) })
			r := res.(*types100.Result)
			for _, i := range r.Interfaces {
				if ver == "1.1.0" {
					require.NotZero(t, i.Mtu, "%s: mtu is a 1.1.0 key", i.Name)
				} else {
					require.Zero(t, i.Mtu, "%s: no mtu before 1.1.0", i.Name)
				}
			}
		})
	}
}

// TestSocketCgroupPath: the node-level cgroup of the socket hooks is
// socketCgroupPath (cgroupPath, which the CNI conventions give to the
// pod's cgroup, still works as its deprecated name); a bad value is code 7
// naming the key that was set, and nothing is left.
func TestSocketCgroupPath(t *testing.T) {
	for _, ver := range []string{"0.4.0", "1.0.0", "1.1.0"} {
		t.Run(ver, func(t *testing.T) {
			e := newEnv(t)
			caps := map[string]any{"portMappings": []any{map[string]any{"hostPort": 18090, "containerPort": 80, "protocol": "tcp"}}}
			for _, key := range []string{"socketCgroupPath", "cgroupPath"} {
				list := e.confList(netOpts{version: ver, extra: map[string]any{key: "relative/dir", "capabilities": map[string]any{"portMappings": true}}})
				_, err := e.cni.AddPod(list, "bad-"+key, caps)
				require.Equal(t, uint(types.ErrInvalidNetworkConfig), cniCode(t, err), "%v", err)
				require.Contains(t, err.Error(), "invalid "+key+":")
				e.requireClean()
				list = e.confList(netOpts{version: ver, extra: map[string]any{key: testutil.Cgroup(t), "capabilities": map[string]any{"portMappings": true}}})
				p, err := e.cni.AddPod(list, "good-"+key, caps)
				require.NoError(t, err, key)
				require.NoError(t, e.cni.DelPod(list, p))
			}
			e.requireClean()
			require.Empty(t, e.ipamOwners())
		})
	}
}
