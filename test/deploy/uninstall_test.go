package deploy_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/nodetest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/cluster"
	"github.com/ebpf-cni/ebpf-cni/pkg/conflist"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// uninstallNode is a simulated node that the DaemonSet's init container
// installed ebpf-cni on, among another network setup's files.
type uninstallNode struct {
	t                 *testing.T
	node              *nettest.Node
	h                 netlinksafe.Handle
	bin, conf         string
	bpfRoot, stateDir string
	install           agent.InstallConfig
	client            kubernetes.Interface
	logs              *syncBuffer
	foreign           map[string][]byte // path: content, the files ebpf-cni did not write
}

// newUninstallNode makes the node: another plugin's binary (and loopback,
// when given), a conflist of another network that sorts before ebpf-cni's
// and one after, in the node's CNI directories (temporary: never the
// machine's), a bpffs of its own, and the Node object with its ranges.
func newUninstallNode(t *testing.T, mode conflist.Mode, loopback []byte) *uninstallNode {
	t.Helper()
	testutil.RequireRoot(t)
	n, err := nettest.NewNode()
	require.NoError(t, err)
	t.Cleanup(n.Close)
	h, err := netlinksafe.NewHandleAt(netns.NsHandle(int(n.NS.Fd())))
	require.NoError(t, err)
	t.Cleanup(h.Close)
	u := &uninstallNode{t: t, node: n, h: h, bin: t.TempDir(), conf: t.TempDir(), bpfRoot: testutil.BPFFS(t),
		stateDir: filepath.Join(t.TempDir(), "state"), logs: &syncBuffer{}, foreign: map[string][]byte{}}
	u.foreign[filepath.Join(u.bin, "bridge")] = []byte("another plugin's binary")
	u.foreign[filepath.Join(u.conf, "05-multus.conf")] = []byte(`{"cniVersion":"1.0.0","name":"multus","type":"multus"}` + "\n")
	u.foreign[filepath.Join(u.conf, "99-other.conflist")] = []byte(`{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"bridge"}]}` + "\n")
	if loopback != nil {
		u.foreign[filepath.Join(u.bin, agent.Loopback)] = loopback
	}
	for p, b := range u.foreign {
		require.NoError(t, os.WriteFile(p, b, 0o755))
	}

	cidrs := []netip.Prefix{netip.MustParsePrefix("10.244.5.0/24"), netip.MustParsePrefix("fd00:10:244:5::/64")}
	sim := &simNode{name: "node-a", ip4: nettest.NodeIP4, ip6: nettest.NodeIP6, podCIDRs: cidrs}
	client := fake.NewClientset()
	_, err = client.CoreV1().Nodes().Create(context.Background(), sim.object(), metav1.CreateOptions{})
	require.NoError(t, err)
	u.client = client
	u.install = agent.InstallConfig{
		NodeName: "node-a", SrcDir: testutil.PluginDir(t), CNIBinDir: u.bin, CNIConfDir: u.conf,
		Conf:   conflist.Options{Masquerade: true, Mode: mode, BPFRoot: u.bpfRoot, StateDir: u.stateDir},
		WarmUp: true, PollEvery: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(u.logs, nil)),
	}
	if mode == conflist.ModeVXLAN {
		u.install.Conf.ClusterCIDRs = clusterCIDRs
	}
	return u
}

// in runs f in the node's network namespace.
func (u *uninstallNode) in(f func() error) error {
	return u.node.NS.Do(func(ns.NetNS) error { return f() })
}

// runInstall is the init container's install, in the node's namespace.
func (u *uninstallNode) runInstall() {
	u.t.Helper()
	require.NoError(u.t, u.in(func() error { return agent.Install(context.Background(), u.client, u.install) }), "%s", u.logs)
}

// addPod attaches pod uninstall-a with a hostPort through the installed
// conflist (its socket hooks on a cgroup of the test's), as a runtime
// would: the uplink's programs and the cgroup's socket hooks run then.
func (u *uninstallNode) addPod() (*nettest.CNI, *libcni.NetworkConfigList, *nettest.Pod) {
	t := u.t
	t.Helper()
	b, err := os.ReadFile(filepath.Join(u.conf, conflist.DefaultFile))
	require.NoError(t, err)
	var l map[string]any
	require.NoError(t, json.Unmarshal(b, &l))
	l["plugins"].([]any)[0].(map[string]any)["socketCgroupPath"] = testutil.Cgroup(t)
	b, err = json.Marshal(l)
	require.NoError(t, err)
	list, err := libcni.ConfListFromBytes(b)
	require.NoError(t, err)
	c := nettest.NewCNI(u.node, []string{u.bin}, t.TempDir())
	pod := testutil.AddPodArgs(t, c, list, "uninstall-a", map[string]any{
		"portMappings": []map[string]any{{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}}}, nil)
	return c, list, pod
}

// uninstall runs the uninstall init container's work in the node's
// namespace; its log is in u.logs.
func (u *uninstallNode) uninstall(force bool) error {
	cfg := agent.UninstallConfig{CNIBinDir: u.bin, CNIConfDir: u.conf, BPFRoot: u.bpfRoot, StateDir: u.stateDir,
		RouteProtocol: agent.DefaultRouteProtocol, AgentHealthAddr: agent.DefaultHealthAddr, Force: force,
		Logger: slog.New(slog.NewTextHandler(u.logs, nil))}
	return u.in(func() error { return agent.Uninstall(cfg) })
}

// files maps every file under the node's CNI directories and bpfRoot to
// its content's digest.
func (u *uninstallNode) files() map[string]string {
	u.t.Helper()
	out := map[string]string{}
	for what, dir := range map[string]string{"bin": u.bin, "conf": u.conf, "bpfRoot": u.bpfRoot} {
		_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil
			}
			rel, _ := filepath.Rel(dir, p)
			p = what + "/" + rel
			if what == "bpfRoot" {
				out[p] = "pinned" // a map's pin reads as its entries, which traffic changes
				return nil
			}
			b, err := os.ReadFile(filepath.Join(dir, rel))
			require.NoError(u.t, err)
			out[p] = fmt.Sprintf("%x", sha256.Sum256(b))
			return nil
		})
	}
	return out
}

// requireOnlyForeign: the CNI directories hold the foreign files, byte for
// byte, and nothing else.
func (u *uninstallNode) requireOnlyForeign() {
	u.t.Helper()
	var want, got []string
	for p, b := range u.foreign {
		want = append(want, p)
		have, err := os.ReadFile(p)
		require.NoError(u.t, err, "%s was removed", p)
		require.Equal(u.t, b, have, "%s changed", p)
	}
	for _, dir := range []string{u.bin, u.conf} {
		for _, f := range tree(u.t, dir) {
			got = append(got, filepath.Join(dir, f))
		}
	}
	require.ElementsMatch(u.t, want, got, "%s", u.logs)
}

// pinnedIDs are the kernel objects pinned under bpfRoot (maps, programs,
// links), by kind: what only the pins keep once nothing runs from them.
func (u *uninstallNode) pinnedIDs() map[string][]uint32 {
	u.t.Helper()
	out := map[string][]uint32{}
	_ = filepath.WalkDir(u.bpfRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if m, err := ebpf.LoadPinnedMap(p, &ebpf.LoadPinOptions{ReadOnly: true}); err == nil {
			if info, err := m.Info(); err == nil {
				id, _ := info.ID()
				out["map"] = append(out["map"], uint32(id))
			}
			m.Close()
		} else if pr, err := ebpf.LoadPinnedProgram(p, nil); err == nil {
			if info, err := pr.Info(); err == nil {
				id, _ := info.ID()
				out["program"] = append(out["program"], uint32(id))
			}
			pr.Close()
		} else if l, err := link.LoadPinnedLink(p, nil); err == nil {
			if info, err := l.Info(); err == nil {
				out["link"] = append(out["link"], uint32(info.ID))
			}
			l.Close()
		}
		return nil
	})
	return out
}

// requireFreed: none of ids is held by the kernel any more: no program of
// ebpf-cni runs on a device or a cgroup, no map or link is left.
func requireFreed(t *testing.T, ids map[string][]uint32) {
	t.Helper()
	exists := func(kind string, id uint32) bool {
		var err error
		switch kind {
		case "map":
			var m *ebpf.Map
			if m, err = ebpf.NewMapFromID(ebpf.MapID(id)); err == nil {
				m.Close()
			}
		case "program":
			var p *ebpf.Program
			if p, err = ebpf.NewProgramFromID(ebpf.ProgramID(id)); err == nil {
				p.Close()
			}
		case "link":
			var l link.Link
			if l, err = link.NewFromID(link.ID(id)); err == nil {
				l.Close()
			}
		}
		return err == nil
	}
	require.Eventually(t, func() bool {
		for kind, list := range ids {
			for _, id := range list {
				if exists(kind, id) {
					return false
				}
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond, "a map, program or link of ebpf-cni is still held: %v", ids)
}

// requireNodeClean: nothing of ebpf-cni is left in the node's network
// namespace, under bpfRoot or in the stateDir; what others made stays.
func (u *uninstallNode) requireNodeClean(ids map[string][]uint32) {
	t := u.t
	t.Helper()
	u.requireOnlyForeign()
	agentRoutes, err := u.h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: agent.DefaultRouteProtocol}, netlink.RT_FILTER_PROTOCOL)
	require.NoError(t, err)
	require.Empty(t, agentRoutes, "routes proto %d", agent.DefaultRouteProtocol)
	require.NoError(t, u.in(func() error {
		rs, err := veth.RangeRoutes()
		require.Empty(t, rs, "the pod ranges' unreachable routes")
		links, lerr := veth.HostLinks()
		require.Empty(t, links, "host veths")
		return errors.Join(err, lerr)
	}))
	_, err = u.h.LinkByName(cluster.Device)
	require.Error(t, err, "the overlay device is still there")
	_, err = os.Stat(u.stateDir)
	require.ErrorIs(t, err, fs.ErrNotExist, "the stateDir")
	require.Empty(t, u.pinnedIDs(), "pins under bpfRoot")
	_, err = os.Stat(u.bpfRoot) // here a directory of the test's bpffs; the DaemonSet's mount point stays, empty
	require.ErrorIs(t, err, fs.ErrNotExist, "bpfRoot")
	requireFreed(t, ids)
}

// TestUninstallFromNode: the uninstall DaemonSet's init container takes
// off a node exactly what ebpf-cni made there, after install by the
// DaemonSet's init container and pods with a hostPort (so the uplink's
// programs and the cgroup's socket hooks run), in mode direct (the agent's
// routes) and vxlan (its tunnel endpoints, the overlay's device). While a
// pod is on ebpf-cni it refuses, naming it, and changes nothing; after
// the pod's DEL (direct) or with --force (vxlan: the pod loses its veth),
// it removes the conflist, the binaries and the record (loopback where
// install put it), the routes of protocol 236, the unreachable routes,
// every pin under bpfRoot (each map, program and link freed in the
// kernel: nothing of ebpf-cni runs on a device or a cgroup) and the
// stateDir; another plugin's binary and loopback, the conflists sorting
// before and after ebpf-cni's and a static route stay as they were. Run
// again, it finds nothing and says so.
func TestUninstallFromNode(t *testing.T) {
	for _, tc := range []struct {
		name     string
		mode     conflist.Mode
		loopback []byte // the node's own; nil: none
		force    bool
	}{
		{name: "direct, no loopback on the node", mode: conflist.ModeDirect},
		{name: "vxlan, the node's loopback, forced", mode: conflist.ModeVXLAN, loopback: []byte("the node's loopback"), force: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newUninstallNode(t, tc.mode, tc.loopback)
			u.runInstall()
			c, list, pod := u.addPod()

			r := func(dst, via string) agent.Route {
				return agent.Route{Dst: netip.MustParsePrefix(dst), Via: netip.MustParseAddr(via)}
			}
			var routes agent.NodeRoutes
			var err error
			if tc.mode == conflist.ModeDirect {
				routes, err = agent.NewDirect(u.h, agent.DefaultRouteProtocol)
			} else {
				routes, err = agent.NewVXLAN(nodetest.Handle(t, u.bpfRoot, u.stateDir), 4)
			}
			require.NoError(t, err)
			require.NoError(t, routes.Ensure(r("10.244.6.0/24", nettest.WorldIP4.String())))
			require.NoError(t, routes.Ensure(r("fd00:10:244:6::/64", nettest.WorldIP6.String())))
			_, static, _ := net.ParseCIDR("10.244.9.0/24")
			require.NoError(t, u.h.RouteAdd(&netlink.Route{Dst: static, Gw: nettest.WorldIP4, Protocol: unix.RTPROT_STATIC}))
			if tc.mode == conflist.ModeVXLAN {
				_, err = u.h.LinkByName(cluster.Device)
				require.NoError(t, err, "ADD made the overlay's device")
			}
			ids := u.pinnedIDs()
			require.NotEmpty(t, ids["link"], "the pod's, the uplink's and the cgroup's links")
			before := u.files()

			err = u.uninstall(false)
			require.ErrorContains(t, err, "1 pod(s) on ebpf-cni here")
			require.ErrorContains(t, err, "container uninstall-a, eth0, network ebpf-cni")
			require.ErrorContains(t, err, "or --force")
			require.Equal(t, before, u.files(), "a refused uninstall changed something")
			_, err = os.Stat(u.stateDir)
			require.NoError(t, err)

			if tc.force {
				require.NoError(t, u.uninstall(true), "%s", u.logs)
				require.Contains(t, u.logs.String(), "--force: taking the network of pods on ebpf-cni away")
				require.Contains(t, u.logs.String(), "endpoint "+veth.HostName("uninstall-a", "eth0"))
				require.Contains(t, u.logs.String(), "removed the agent's tunnel endpoint")
				for _, set := range []string{"cgroup on hostport", "uplinks on uplink", "tunnels on " + cluster.Device} {
					require.Contains(t, u.logs.String(), "programs of "+set)
				}
				require.Contains(t, u.logs.String(), "removed the overlay device")
			} else {
				require.NoError(t, c.DelPod(list, pod)) // the node's last DEL takes the uplink's and cgroup's programs away
				before = u.files()
				// The DaemonSet's agent still answers on the node: its
				// routes would come back.
				stop := u.fakeAgent()
				require.ErrorContains(t, u.uninstall(false), "the agent of node node-a answers on 127.0.0.1:9965: the ebpf-cni DaemonSet still runs here")
				require.Equal(t, before, u.files(), "a refused uninstall changed something")
				stop()
				require.NoError(t, u.uninstall(false), "%s", u.logs)
				require.Contains(t, u.logs.String(), "removed the agent's route")
			}
			require.Contains(t, u.logs.String(), "removed the conflist")
			require.Contains(t, u.logs.String(), "removed the pins under bpfRoot")
			require.Contains(t, u.logs.String(), "removed the state dir")
			u.requireNodeClean(ids)
			rs, err := u.h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: static}, netlink.RT_FILTER_DST)
			require.NoError(t, err)
			require.Len(t, rs, 1, "the static route stays")

			u.logs = &syncBuffer{}
			require.NoError(t, u.uninstall(false), "again")
			require.Contains(t, u.logs.String(), "nothing to remove: ebpf-cni has nothing left on this node", "%v", u.files())
			require.NotContains(t, u.logs.String(), "removed")
			u.requireNodeClean(ids)
		})
	}
}

// fakeAgent answers /readyz on the agent's health address in the node's
// namespace, as a running agent does, until stopped.
func (u *uninstallNode) fakeAgent() (stop func()) {
	u.t.Helper()
	var l net.Listener
	require.NoError(u.t, u.in(func() error {
		var err error
		l, err = net.Listen("tcp", agent.DefaultHealthAddr)
		return err
	}))
	srv := &http.Server{ReadHeaderTimeout: time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(agent.Status{Ready: true, Live: true, Node: "node-a", Mode: "direct"})
	})}
	go func() { _ = srv.Serve(l) }()
	return func() { _ = srv.Close() }
}

// buildLoopback builds the reference loopback as ebpf-cni's Makefile does,
// with the Go flags given (an earlier release's version stamp, or another
// build's), into a directory of the test.
func buildLoopback(t *testing.T, flags ...string) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "loopback")
	cmd := exec.Command("go", append(append([]string{"build", "-o", out}, flags...), testutil.UpstreamLoopback)...)
	cmd.Dir = testutil.ModuleRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build: %s", b)
	data, err := os.ReadFile(out)
	require.NoError(t, err)
	return data
}

// TestUninstallLoopback: install records the loopback it put on a node
// that had none, and one an earlier release put there without a record
// (the image's byte for byte, or any build of ebpf-cni's Makefile: v0.1.0
// stamped its version into it); never the node's own (another build), and
// uninstall leaves that. A loopback install put there that another
// installer has replaced since is not ebpf-cni's any more: uninstall keeps
// it, after a reinstall too.
func TestUninstallLoopback(t *testing.T) {
	testutil.RequireRoot(t)
	image, err := os.ReadFile(filepath.Join(testutil.PluginDir(t), agent.Loopback))
	require.NoError(t, err)
	for _, tc := range []struct {
		name     string
		node     []byte // the node's loopback before install; nil: none
		replaced bool   // another installer replaces it after install
		ours     bool   // install records it, uninstall removes it
	}{
		{name: "none on the node", ours: true},
		{name: "the image's, unrecorded", node: image, ours: true},
		{name: "an earlier release's build", node: buildLoopback(t, "-ldflags", "-s -w -X github.com/ebpf-cni/ebpf-cni/pkg/buildinfo.Version=v0.1.0"), ours: true},
		// As containernetworking/plugins' release script builds it.
		{name: "another build", node: buildLoopback(t, "-ldflags", "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=v1.9.1")},
		{name: "not a program", node: []byte("the node's loopback")},
		{name: "ours, replaced since", replaced: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newUninstallNode(t, conflist.ModeDirect, tc.node)
			u.install.WarmUp = false // no programs: the files are the question
			path := filepath.Join(u.bin, agent.Loopback)
			if tc.ours {
				delete(u.foreign, path) // ebpf-cni's, although install did not write it
			}
			u.runInstall()
			if tc.replaced {
				u.foreign[path] = []byte("another installer's loopback")
				require.NoError(t, os.WriteFile(path, u.foreign[path], 0o755))
				u.runInstall()
			}
			rec, err := os.ReadFile(filepath.Join(u.bin, agent.InstallRecord))
			require.NoError(t, err)
			have, err := os.ReadFile(path)
			require.NoError(t, err)
			require.Equal(t, tc.node == nil || tc.ours, bytes.Contains(rec, []byte("bin loopback sha256=")), "the record:\n%s", rec)
			require.Equal(t, tc.ours, bytes.Contains(rec, []byte(fmt.Sprintf("bin loopback sha256=%x\n", sha256.Sum256(have)))), "the record:\n%s", rec)

			require.NoError(t, u.uninstall(false), "%s", u.logs)
			u.requireOnlyForeign()
			if !tc.ours {
				require.Contains(t, u.logs.String(), "kept the loopback plugin there")
			}
			if tc.replaced {
				require.Contains(t, u.logs.String(), "kept a binary ebpf-cni wrote once: it has changed since")
			}
		})
	}
}

// TestUninstallConflist: the conflist install wrote goes while its first
// plugin is ebpf-cni's, with the plugins another installer chained after
// it (istio-cni's way); one someone has made another plugin's since, or
// replaced with what is no plugin list, is theirs and stays, byte for
// byte, and the log says why.
func TestUninstallConflist(t *testing.T) {
	for _, tc := range []struct {
		name    string
		replace []byte // the conflist's content after install; nil: kept as install wrote it, istio-cni chained
		log     string
	}{
		{name: "ebpf-cni's, a plugin chained", log: `msg="removed the conflist"`},
		{name: "another plugin's now", replace: []byte(`{"cniVersion":"1.0.0","name":"ebpf-cni","plugins":[{"type":"bridge"},{"type":"ebpf-cni"}]}` + "\n"),
			log: `msg="kept the conflist: its first plugin is not ebpf-cni's any more (someone replaced the file)"`},
		{name: "no plugin list", replace: []byte(`{"cniVersion":"1.0.0","name":"x","type":"bridge"}` + "\n"),
			log: `msg="kept the conflist: it is no plugin list (not what ebpf-cni wrote there)"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newUninstallNode(t, conflist.ModeDirect, nil)
			u.install.WarmUp = false
			u.runInstall()
			path := filepath.Join(u.conf, conflist.DefaultFile)
			if tc.replace == nil {
				appendPlugin(t, path, `{"type":"istio-cni"}`)
			} else {
				u.foreign[path] = tc.replace
				require.NoError(t, os.WriteFile(path, tc.replace, 0o644))
			}
			require.NoError(t, u.uninstall(false), "%s", u.logs)
			require.Contains(t, u.logs.String(), tc.log)
			if tc.replace == nil {
				require.Contains(t, u.logs.String(), `chained=istio-cni`)
			}
			u.requireOnlyForeign()
		})
	}
}
