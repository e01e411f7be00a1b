package agent

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"

	"github.com/ebpf-cni/ebpf-cni/pkg/cluster"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
	"github.com/ebpf-cni/ebpf-cni/pkg/ipam"
	cnimaps "github.com/ebpf-cni/ebpf-cni/pkg/maps"
	nodestate "github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/repair"
	"github.com/ebpf-cni/ebpf-cni/pkg/rtnl"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// UninstallConfig is what the uninstall DaemonSet's init container does.
type UninstallConfig struct {
	// CNIBinDir and CNIConfDir are the node's /opt/cni/bin and
	// /etc/cni/net.d as mounted in the container, as Install's.
	CNIBinDir, CNIConfDir string
	// BPFRoot and StateDir are the plugin's bpfRoot and stateDir where
	// this container sees them (the DaemonSet: /bpf-root, /run/ebpf-cni).
	BPFRoot, StateDir string
	// NodeBPFRoot is the plugin's bpfRoot on the node (the conflist's), to
	// refuse one that is not ebpf-cni's own directory; "" is BPFRoot.
	NodeBPFRoot string
	// RouteProtocol tags the agent's routes (DefaultRouteProtocol).
	RouteProtocol int
	// AgentHealthAddr is where the node's agent answers /readyz when it
	// runs (DefaultHealthAddr); "" does not ask.
	AgentHealthAddr string
	// Force goes on while pods are on ebpf-cni (their network is taken
	// away) or the agent runs.
	Force  bool
	Logger *slog.Logger
}

// sharedDirs are never ebpf-cni's alone: a bpfRoot or stateDir set to one
// (a slip in a conflist key) must not make uninstall empty it.
var sharedDirs = []string{"/", "/sys", "/sys/fs", "/sys/fs/bpf", "/run", "/var/run", "/tmp", "/var", "/var/lib", "/etc", "/opt", "/usr", "/home", "/root"}

func (cfg *UninstallConfig) check() error {
	for _, d := range []struct {
		what, path string
		emptied    bool // uninstall removes all it holds
	}{
		{"the CNI bin dir", cfg.CNIBinDir, false}, {"the CNI conf dir", cfg.CNIConfDir, false},
		{"bpfRoot", cfg.BPFRoot, true}, {"bpfRoot", cfg.NodeBPFRoot, true}, {"stateDir", cfg.StateDir, true},
	} {
		if d.path == "" {
			return fmt.Errorf("no %s given", d.what)
		}
		if !filepath.IsAbs(d.path) {
			return fmt.Errorf("%s %s: want an absolute path", d.what, d.path)
		}
		if d.emptied && slices.Contains(sharedDirs, filepath.Clean(d.path)) {
			return fmt.Errorf("%s %s: not a directory of ebpf-cni's own, refusing to empty it", d.what, d.path)
		}
	}
	if cfg.RouteProtocol <= 4 || cfg.RouteProtocol > 255 {
		return fmt.Errorf("route protocol %d: want 5..255", cfg.RouteProtocol)
	}
	return nil
}

// Uninstall takes ebpf-cni off the node, in the node's network namespace
// (the DaemonSet's host network), and removes only what ebpf-cni made:
//
//   - It refuses, changing nothing, while pods are on ebpf-cni (a host
//     veth of ours is the kernel's proof): with the plugin gone their DEL
//     would fail, and kubelet retries a pod's teardown forever; and while
//     the node's agent answers (it would put its routes back). Force goes
//     on: those pods lose their network.
//   - The conflists Install recorded first, so that no new pod comes, each
//     only while its first plugin is ebpf-cni's (a file someone has made
//     another plugin's stays, and the log says why); another conflist is
//     never touched.
//   - The agent's routes (its protocol) and tunnel endpoints, then every
//     endpoint and the node-wide state of the plugin (repair.Uninstall),
//     then every pin under bpfRoot and the stateDir.
//   - Last the recorded binaries, loopback only while it is the content
//     ebpf-cni wrote, and the record. When the node's state could not all
//     be removed, the binaries stay (ebpf-cni's CLI can tell what is left)
//     and the error says what failed: run it again.
//
// It logs each thing it removes; run again, it finds nothing and says so.
func Uninstall(cfg UninstallConfig) error {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.NodeBPFRoot == "" {
		cfg.NodeBPFRoot = cfg.BPFRoot
	}
	if err := cfg.check(); err != nil {
		return err
	}
	u := &uninstaller{cfg: cfg, log: cfg.Logger}
	if node, ok := agentAnswers(cfg.AgentHealthAddr); ok {
		if !cfg.Force {
			return fmt.Errorf("the agent of node %s answers on %s: the ebpf-cni DaemonSet still runs here (its agent would put its routes back, its init container the plugins); delete it first (kubectl delete -f ebpf-cni.yaml, or helm uninstall), or --force", node, cfg.AgentHealthAddr)
		}
		u.log.Warn("--force: going on although the agent answers: it may put back its routes or tunnel endpoints", "node", node, "addr", cfg.AgentHealthAddr)
	}
	rec, err := readRecord(cfg.CNIBinDir)
	if err != nil {
		return err
	}
	_, serr := os.Stat(cfg.StateDir)
	stateExisted := serr == nil
	// The node lock, exclusively, when there is a stateDir to hold it in:
	// no ADD or DEL is half-way while the endpoints are counted and
	// removed.
	lock := nodestate.Unlocked
	if stateExisted {
		lock = nodestate.Exclusive
	}
	nd, err := nodestate.Open(nodestate.Options{BPFRoot: cfg.BPFRoot, StateDir: cfg.StateDir, Objects: features.Objects(), Tag: features.Tag(), Lock: lock})
	if err != nil {
		return err
	}
	defer nd.Close()
	if err := u.refuseLive(); err != nil {
		return err
	}

	for _, e := range rec {
		if e.Dir == recordConf {
			u.conflist(e.Name)
		}
	}
	u.agentState(nd)
	u.pluginState(nd, stateExisted)
	if u.failed() {
		u.log.Error("kept the plugins and the record: run uninstall again once what failed is fixed (ebpf-cni status, from the CNI bin dir, shows what is left)")
		return fmt.Errorf("removing ebpf-cni's state from the node: %w", errors.Join(u.errs...))
	}
	u.binaries(rec)
	path := filepath.Join(cfg.CNIBinDir, InstallRecord)
	switch err := os.Remove(path); {
	case err == nil:
		u.removed("removed the install record", "path", path)
	case !errors.Is(err, fs.ErrNotExist):
		u.errs = append(u.errs, fmt.Errorf("removing the install record: %w", err))
	}
	if u.count == 0 {
		u.log.Info("nothing to remove: ebpf-cni has nothing left on this node")
	} else {
		u.log.Info("ebpf-cni removed from the node", "items", u.count)
	}
	return errors.Join(u.errs...)
}

// uninstaller is one Uninstall: what it removed, what failed.
type uninstaller struct {
	cfg   UninstallConfig
	log   *slog.Logger
	count int
	errs  []error
}

func (u *uninstaller) failed() bool { return errors.Join(u.errs...) != nil }

// read is the file at path; false when it is not there, or could not be
// read (the error kept).
func (u *uninstaller) read(path string) ([]byte, bool) {
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		u.errs = append(u.errs, fmt.Errorf("reading %s: %w", path, err))
	}
	return b, err == nil
}

func (u *uninstaller) removed(msg string, args ...any) {
	u.count++
	u.log.Info(msg, args...)
}

// refuseLive fails while pods are on ebpf-cni (unless forced): their host
// veths are here. Addresses ebpf-ipam holds for containers without an
// endpoint (another plugin's pods on ebpf-ipam, or a runtime that never
// called DEL) go with the state; they are named.
func (u *uninstaller) refuseLive() error {
	links, err := veth.HostLinks()
	if err != nil {
		return err
	}
	var live []string
	owners := map[string]bool{}
	for _, l := range links {
		o, ok := veth.Owner(l)
		if !ok {
			live = append(live, l.Attrs().Name)
			continue
		}
		owners[o.ContainerID+"/"+o.IfName] = true
		live = append(live, fmt.Sprintf("%s (container %s, %s, network %s)", l.Attrs().Name, o.ContainerID, o.IfName, o.Network))
	}
	if len(live) > 0 && !u.cfg.Force {
		return fmt.Errorf("%d pod(s) on ebpf-cni here: %s; their DEL would find no plugin, and kubelet would retry their teardown forever: drain the node (kubectl drain) or delete those pods first, or --force (they lose their network)",
			len(live), strings.Join(live, "; "))
	}
	if len(live) > 0 {
		u.log.Warn("--force: taking the network of pods on ebpf-cni away", "endpoints", strings.Join(live, "; "))
	}
	held, err := ipam.ListHeld(u.cfg.StateDir)
	if err != nil {
		u.log.Warn("reading ebpf-ipam's records", "err", err)
	}
	for _, h := range held {
		if !owners[h.ContainerID+"/"+h.IfName] {
			u.log.Warn("ebpf-ipam holds addresses for a container without an endpoint of ebpf-cni (another plugin's pod on ebpf-ipam, or one never deleted): they go with the state",
				"network", h.Network, "container", h.ContainerID, "ifname", h.IfName, "netns", h.NetNS)
		}
	}
	return nil
}

// conflist removes the recorded conflist name while its first plugin is
// ebpf-cni's; the plugins chained after it (istio-cni's) go with it.
func (u *uninstaller) conflist(name string) {
	path := filepath.Join(u.cfg.CNIConfDir, name)
	b, ok := u.read(path)
	if !ok {
		return
	}
	var l struct {
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(b, &l); err != nil || len(l.Plugins) == 0 {
		u.log.Warn("kept the conflist: it is no plugin list (not what ebpf-cni wrote there)", "path", path)
		return
	}
	if first := l.Plugins[0].Type; first != "ebpf-cni" {
		u.log.Warn("kept the conflist: its first plugin is not ebpf-cni's any more (someone replaced the file)", "path", path, "first", first)
		return
	}
	if err := os.Remove(path); err != nil {
		u.errs = append(u.errs, fmt.Errorf("removing %s: %w", path, err))
		return
	}
	var chained []string
	for _, p := range l.Plugins[1:] {
		chained = append(chained, p.Type)
	}
	u.removed("removed the conflist", "path", path, "chained", strings.Join(chained, ","))
}

// agentState removes the agent's routes (mode direct) and tunnel
// endpoints (mode vxlan), whatever the mode now: the ConfigMap may have
// changed since they were written.
func (u *uninstaller) agentState(nd *nodestate.Node) {
	h, err := netlinksafe.NewHandle()
	if err != nil {
		u.errs = append(u.errs, fmt.Errorf("netlink: %w", err))
		return
	}
	defer h.Close()
	d, err := NewDirect(h, u.cfg.RouteProtocol)
	if err == nil {
		err = u.withdraw(d, "removed the agent's route")
	}
	u.errs = append(u.errs, err)
	// The tunnel endpoints are in the cluster's pinned map; a node that
	// has none had no overlay (NewVXLAN would make the map).
	if nd.CheckBPFFS() != nil || !nd.HasMap(cnimaps.CniMapClusterRoutes) {
		return
	}
	v, err := NewVXLAN(nd, UnderlayFamily())
	if err == nil {
		err = u.withdraw(v, "removed the agent's tunnel endpoint")
	}
	u.errs = append(u.errs, err)
}

// withdraw removes every entry routes installed.
func (u *uninstaller) withdraw(routes NodeRoutes, msg string) error {
	list, err := routes.List()
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range list {
		if err := routes.Remove(r); err != nil {
			errs = append(errs, err)
			continue
		}
		u.removed(msg, "route", r.String())
	}
	return errors.Join(errs...)
}

// pluginState removes the plugin's endpoints, its node-wide state, its
// pins and its state dir.
func (u *uninstaller) pluginState(nd *nodestate.Node, stateExisted bool) {
	overlay := func() bool { _, err := rtnl.H().LinkByName(cluster.Device); return err == nil }
	hadOverlay := overlay()
	lines, err := repair.Uninstall(nd)
	for _, l := range lines {
		u.removed("removed", "what", l)
	}
	u.errs = append(u.errs, err)
	if hadOverlay && !overlay() {
		u.removed("removed the overlay device", "device", cluster.Device)
	}
	if u.failed() {
		return // the pins hold what is left: keep them for a retry
	}
	pins, err := nd.RemovePins()
	if pins > 0 {
		u.removed("removed the pins under bpfRoot (maps, programs, links)", "bpfRoot", u.cfg.NodeBPFRoot, "pins", pins)
	}
	u.errs = append(u.errs, err)
	files, err := nd.RemoveStateDir()
	// A stateDir this run made (the features' locks) was not there
	// before: nothing of ebpf-cni's.
	if stateExisted {
		u.removed("removed the state dir", "stateDir", u.cfg.StateDir, "files", files)
	}
	u.errs = append(u.errs, err)
}

// binaries removes the recorded binaries; one whose content the record
// lists (loopback) only while it is one of those.
func (u *uninstaller) binaries(rec installRecord) {
	var seen []string
	for _, e := range rec {
		if e.Dir != recordBin || slices.Contains(seen, e.Name) {
			continue
		}
		seen = append(seen, e.Name)
		path := filepath.Join(u.cfg.CNIBinDir, e.Name)
		data, ok := u.read(path)
		if !ok {
			continue
		}
		if sums := rec.sums(e.Name); len(sums) > 0 && !slices.Contains(sums, sha256Of(data)) {
			u.log.Info("kept a binary ebpf-cni wrote once: it has changed since (another installer's now)", "path", path)
			continue
		}
		if err := os.Remove(path); err != nil {
			u.errs = append(u.errs, fmt.Errorf("removing %s: %w", path, err))
			continue
		}
		u.removed("removed the plugin", "path", path)
	}
}

// agentAnswers asks addr's /readyz whether an agent of ebpf-cni answers
// there, and for which node. The connection is made from the calling
// goroutine (its thread's network namespace), not from a transport's.
func agentAnswers(addr string) (string, bool) {
	if addr == "" {
		return "", false
	}
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	req, err := http.NewRequest(http.MethodGet, "/readyz", nil)
	if err != nil {
		return "", false
	}
	req.Host = addr
	if req.Write(c) != nil {
		return "", false
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), req)
	if err != nil {
		return "", false
	}
	defer resp.Body.Close()
	var s Status
	if json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&s) != nil || s.Mode == "" {
		return "", false
	}
	return s.Node, true
}
