package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ebpf-cni/ebpf-cni/pkg/conflist"
)

// Plugins are the binaries Install puts on the node.
var Plugins = []string{"ebpf-cni", "ebpf-ipam"}

// Loopback is the reference plugin that brings up a pod's lo. containerd
// runs it before every pod's network (and CRI-O has it built in): when the
// node has none, the pod's ADD fails after ebpf-cni's succeeded, and the
// teardown stops at loopback's failing DEL, so ebpf-cni's DEL is never
// called and the pod's address and endpoint leak. The image carries one
// (containernetworking/plugins, built by make build); Install puts it on a
// node that lacks one and never replaces the node's own.
const Loopback = "loopback"

// InstallConfig is what the DaemonSet's init container does.
type InstallConfig struct {
	NodeName string
	// SrcDir holds the plugin binaries (in the image: /opt/ebpf-cni/bin).
	SrcDir string
	// CNIBinDir and CNIConfDir are the node's /opt/cni/bin and
	// /etc/cni/net.d as mounted in the container.
	CNIBinDir  string
	CNIConfDir string
	ConfFile   string // DefaultFile when empty
	// Conf is the conflist to write, less the pod ranges: those come from
	// the Node's spec.podCIDRs.
	Conf conflist.Options
	// WarmUp runs the installed plugin's STATUS once: it loads and pins
	// the datapath programs, so the node's first pod does not pay for it,
	// and a node whose kernel cannot run the plugin fails here, in the
	// DaemonSet pod's log, rather than at every pod's start.
	WarmUp bool
	// BPFRootMount is where the plugin's bpfRoot is mounted in this
	// container, when not at its path on the node (Conf.BPFRoot, or the
	// plugin's default), which the conflist keeps: the warm-up STATUS
	// runs with it.
	BPFRootMount string
	// PollEvery is how often the Node is read while it has no pod range.
	PollEvery time.Duration
	Logger    *slog.Logger
}

// Install records what it writes (InstallRecord, for Uninstall), copies
// the plugins, waits until the Node has spec.podCIDRs, runs
// the plugin's STATUS (WarmUp), and then writes the conflist for them
// (replacing the one it wrote before, the plugins another installer
// chained after ebpf-cni's kept: the DaemonSet owns that file). A node
// without a conflist is one the runtime reports as not ready
// (NetworkPluginNotReady), so kubelet schedules no pod there until this is
// done; when STATUS fails, the conflist of an earlier run is removed.
func Install(ctx context.Context, client kubernetes.Interface, cfg InstallConfig) error {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ConfFile == "" {
		cfg.ConfFile = conflist.DefaultFile
	}
	if cfg.PollEvery <= 0 {
		cfg.PollEvery = 2 * time.Second
	}
	if err := cfg.check(); err != nil {
		return err
	}
	// The record first, with what this run writes: a run killed between
	// a write and its record would leave a file no uninstall removes.
	// Reinstalling (a restarted pod, a rollout) adds to it.
	rec, err := readRecord(cfg.CNIBinDir)
	if err != nil {
		return err
	}
	for _, b := range Plugins {
		rec.add(recordEntry{Dir: recordBin, Name: b})
	}
	lo, err := cfg.planLoopback()
	if err != nil {
		return err
	}
	if lo.ours != "" {
		rec.add(recordEntry{Dir: recordBin, Name: Loopback, SHA256: lo.ours})
	}
	rec.add(recordEntry{Dir: recordConf, Name: cfg.ConfFile})
	if err := rec.save(cfg.CNIBinDir); err != nil {
		return err
	}
	for _, b := range Plugins {
		changed, err := copyFile(filepath.Join(cfg.SrcDir, b), filepath.Join(cfg.CNIBinDir, b), 0o755)
		if err != nil {
			return err
		}
		cfg.Logger.Info("plugin installed", "path", filepath.Join(cfg.CNIBinDir, b), "changed", changed)
	}
	if err := cfg.installLoopback(lo); err != nil {
		return err
	}
	cidrs, err := waitForPodCIDRs(ctx, client, cfg)
	if err != nil {
		return err
	}
	o := cfg.Conf
	o.PodCIDRs = cidrs
	data, err := conflist.Build(o)
	if err != nil {
		return err
	}
	// The conflist last, once STATUS passed: a runtime reports the node's
	// network ready as soon as it finds one, and must not with a plugin
	// that cannot load here.
	if cfg.WarmUp {
		start := time.Now()
		if err := warmUp(ctx, cfg.CNIBinDir, data, cfg.BPFRootMount); err != nil {
			return cfg.withdraw(err)
		}
		cfg.Logger.Info("plugin ready (STATUS)", "took", time.Since(start).Round(time.Millisecond).String())
	}
	// Plugins another installer chained after ebpf-cni's (istio-cni
	// appends itself to the node's primary conflist) stay chained.
	if old, err := os.ReadFile(filepath.Join(cfg.CNIConfDir, cfg.ConfFile)); err == nil {
		if data, err = conflist.KeepChained(data, old); err != nil {
			return err
		}
	}
	path, err := conflist.Write(cfg.CNIConfDir, cfg.ConfFile, data, true)
	if err != nil {
		return err
	}
	cfg.Logger.Info("conflist written", "path", path, "podCIDRs", fmt.Sprint(cidrs))
	return nil
}

// withdraw removes the conflist an earlier run wrote, after STATUS failed
// with err: the plugins were replaced already, and a runtime that does not
// call STATUS itself (containerd 1.x) would keep the node Ready with a
// plugin that cannot load. Without the file every runtime reports the
// network not ready until a later run (kubelet restarts the init
// container) passes STATUS.
func (cfg *InstallConfig) withdraw(err error) error {
	path := filepath.Join(cfg.CNIConfDir, cfg.ConfFile)
	switch rerr := os.Remove(path); {
	case rerr == nil:
		cfg.Logger.Error("removed the conflist: the node's network is not ready until STATUS passes", "path", path)
		return fmt.Errorf("%w; removed %s", err, path)
	case errors.Is(rerr, os.ErrNotExist):
		return fmt.Errorf("%w; no conflist written", err)
	default:
		return fmt.Errorf("%w; removing %s: %v", err, path, rerr)
	}
}

// loopbackPlan is what Install does with loopback.
type loopbackPlan struct {
	install bool   // copy the image's: the node has none
	ours    string // SHA-256 of the loopback to record as ebpf-cni's; "" for none
	why     string // what the log says
}

// planLoopback decides, before anything is written, whether the image's
// loopback goes onto the node and whether the node's loopback is
// ebpf-cni's. The node's own loopback (its distribution's) is never
// replaced and never recorded: uninstall must leave it. One that is
// ebpf-cni's is recorded although this run did not write it: an earlier
// release (v0.1.0) put it there and kept no record. It is ebpf-cni's when
// it is byte for byte the image's, or when ebpf-cni's Makefile built it
// (builtByEbpfCNI): each release stamps its version into the build, so
// v0.1.0's loopback is not byte for byte a later image's.
func (cfg *InstallConfig) planLoopback() (loopbackPlan, error) {
	dst, src := filepath.Join(cfg.CNIBinDir, Loopback), filepath.Join(cfg.SrcDir, Loopback)
	image, ierr := os.ReadFile(src)
	if ierr != nil && !errors.Is(ierr, fs.ErrNotExist) {
		return loopbackPlan{}, fmt.Errorf("reading %s: %w", src, ierr)
	}
	node, err := os.ReadFile(dst)
	switch {
	case errors.Is(err, fs.ErrNotExist) && ierr != nil:
		return loopbackPlan{}, nil // said loudly by installLoopback
	case errors.Is(err, fs.ErrNotExist):
		return loopbackPlan{install: true, ours: sha256Of(image)}, nil
	case err != nil:
		return loopbackPlan{}, fmt.Errorf("reading %s: %w", dst, err)
	case ierr == nil && bytes.Equal(node, image):
		return loopbackPlan{ours: sha256Of(node), why: "ebpf-cni's: the image's"}, nil
	case builtByEbpfCNI(dst):
		return loopbackPlan{ours: sha256Of(node), why: "ebpf-cni's: built by an ebpf-cni release"}, nil
	}
	return loopbackPlan{why: "the node's own"}, nil
}

// installLoopback puts the image's loopback into the node's bin dir when
// the node has none, and says loudly when neither has one.
func (cfg *InstallConfig) installLoopback(lo loopbackPlan) error {
	dst := filepath.Join(cfg.CNIBinDir, Loopback)
	if !lo.install {
		if lo.why == "" {
			cfg.Logger.Error("the node has no loopback plugin and there is none to install: the runtime fails every pod after ebpf-cni's ADD and never calls its DEL (addresses leak); install containernetworking-plugins' loopback into the CNI bin dir",
				"path", dst)
			return nil
		}
		cfg.Logger.Info("kept the loopback plugin there", "path", dst, "whose", lo.why)
		return nil
	}
	if _, err := copyFile(filepath.Join(cfg.SrcDir, Loopback), dst, 0o755); err != nil {
		return err
	}
	cfg.Logger.Info("plugin installed (the node had no loopback)", "path", dst)
	return nil
}

// check is what can be checked without the node's ranges, so that a bad
// ConfigMap fails at once rather than after the wait.
func (cfg *InstallConfig) check() error {
	if cfg.NodeName == "" {
		return errors.New("no node name: set NODE_NAME (the DaemonSet passes spec.nodeName) or -node")
	}
	// A stand-in for the node's range: one inside the cluster's ranges
	// (so the Service ranges are checked against those), else any.
	probe := cfg.Conf
	probe.PodCIDRs = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	if len(probe.ClusterCIDRs) > 0 {
		c := probe.ClusterCIDRs[0]
		probe.PodCIDRs = []netip.Prefix{netip.PrefixFrom(c.Addr(), max(c.Bits(), c.Addr().BitLen()-8))}
	} else {
		probe.ServiceCIDRs = nil
	}
	_, err := conflist.Build(probe)
	return err
}

func waitForPodCIDRs(ctx context.Context, client kubernetes.Interface, cfg InstallConfig) ([]netip.Prefix, error) {
	var lastLog time.Time
	for {
		n, err := client.CoreV1().Nodes().Get(ctx, cfg.NodeName, metav1.GetOptions{})
		var why string
		switch {
		case err != nil:
			why = fmt.Sprintf("reading the Node: %v", err)
		default:
			p, perr := PeerOf(n)
			if perr != nil {
				why = perr.Error()
			} else if len(p.PodCIDRs) == 0 {
				why = "the Node has no spec.podCIDRs yet: the cluster must allocate node ranges (kube-controller-manager --allocate-node-cidrs --cluster-cidr, or kubeadm init --pod-network-cidr)"
			} else {
				return p.PodCIDRs, nil
			}
		}
		if time.Since(lastLog) > 30*time.Second {
			cfg.Logger.Warn("waiting for this node's pod range", "node", cfg.NodeName, "why", why)
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for node %s's pod range: %w (last: %s)", cfg.NodeName, ctx.Err(), why)
		case <-time.After(cfg.PollEvery):
		}
	}
}

// copyFile replaces dst with src through a temporary file and a rename: a
// runtime may exec the plugin at any moment and must find the old binary
// or the new one. It reports whether dst changed.
func copyFile(src, dst string, mode os.FileMode) (bool, error) {
	data, err := os.ReadFile(src)
	if err != nil {
		return false, fmt.Errorf("reading %s: %w", src, err)
	}
	if old, err := os.ReadFile(dst); err == nil && bytes.Equal(old, data) {
		return false, nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".*.tmp")
	if err != nil {
		return false, fmt.Errorf("writing in %s: %w", filepath.Dir(dst), err)
	}
	defer os.Remove(tmp.Name())
	_, err = io.Copy(tmp, bytes.NewReader(data))
	if err == nil {
		err = tmp.Chmod(mode)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return false, fmt.Errorf("replacing %s: %w", dst, err)
	}
	return true, nil
}

// warmUp runs STATUS of the installed plugin on the conflist's plugin
// configuration, as a runtime with CNI 1.1.0 would, with bpfRoot, when set,
// where this container sees it.
func warmUp(ctx context.Context, binDir string, list []byte, bpfRootMount string) error {
	var l struct {
		Name    string           `json:"name"`
		Plugins []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(list, &l); err != nil || len(l.Plugins) == 0 {
		return fmt.Errorf("reading the conflist for STATUS: %v", err)
	}
	conf := l.Plugins[0]
	conf["name"], conf["cniVersion"] = l.Name, conflist.NewestVersion // STATUS exists from 1.1.0
	if bpfRootMount != "" {
		conf["bpfRoot"] = bpfRootMount
	}
	stdin, err := json.Marshal(conf)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "ebpf-cni"))
	cmd.Env = []string{"CNI_COMMAND=STATUS", "CNI_PATH=" + binDir, "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("the plugin's STATUS failed (%v): %s %s", err, bytes.TrimSpace(stdout.Bytes()), bytes.TrimSpace(stderr.Bytes()))
	}
	return nil
}
