package deploy_test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"

	"github.com/ebpf-cni/ebpf-cni/internal/kubetest"
	"github.com/ebpf-cni/ebpf-cni/internal/nodetest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/cluster"
	"github.com/ebpf-cni/ebpf-cni/pkg/config"
	"github.com/ebpf-cni/ebpf-cni/pkg/conflist"
)

// makeImage runs make image with no network at all (its own network
// namespace) with a version of the test's, and loads the archive it writes
// into podman (removed at the end); it returns the image, the directory of
// the binaries it holds and the archive.
func makeImage(t *testing.T) (image, bin, archive string) {
	t.Helper()
	if _, err := exec.LookPath("podman"); err != nil {
		t.Fatal("podman is missing (make deps installs it)")
	}
	version := fmt.Sprintf("test-%d", time.Now().UnixNano())
	image = "localhost/ebpf-cni:" + version
	bin = t.TempDir()
	archive = filepath.Join(bin, "ebpf-cni-"+version+".oci.tar")
	cmd := exec.Command("unshare", "--net", "--", "make", "--no-print-directory", "-C", testutil.ModuleRoot(), "image", "BIN="+bin, "VERSION="+version)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "make image: "+image+" in "+archive+" ")
	t.Cleanup(func() { _ = exec.Command("podman", "rmi", "-f", image).Run() })
	require.Contains(t, podman(t, "load", "-i", archive), "Loaded image: "+image)
	return image, bin, archive
}

// podRun is the podman command line that starts container c of the
// DaemonSet as a kubelet would: its command, its environment (the node's
// name and the ConfigMap's values), its security context (capabilities,
// read-only root, no privilege escalation, seccomp), its mounts (each host path
// replaced by the test's directory for it, mounted where the manifest
// says), in the network namespace netnsPath, never the machine's. Debian's
// runc, as a kubelet's containerd would use: it mounts a read-only sysfs
// at /sys, and a volume cannot be mounted where no directory exists on it.
// The kubeconfig stands in for the service account's credentials.
func podRun(t *testing.T, m *manifest, c corev1.Container, image, netnsPath string, host map[string]string, kubeconfig string, extra ...string) []string {
	t.Helper()
	args := []string{"--runtime", "runc", "run", "--network", "ns:" + netnsPath,
		// Root here lacks CAP_SYS_RESOURCE: podman's default limits
		// (above the current ones) cannot be set; lower ones can.
		"--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096",
		"--read-only-tmpfs=false", "--cap-drop", "ALL"}
	sc := c.SecurityContext
	for _, cap := range sc.Capabilities.Add {
		args = append(args, "--cap-add", string(cap))
	}
	if sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem {
		args = append(args, "--read-only")
	}
	if sc.RunAsUser != nil {
		args = append(args, "--user", fmt.Sprint(*sc.RunAsUser))
	}
	if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
		args = append(args, "--security-opt", "no-new-privileges")
	}
	// Without a profile in the manifest, the runtime's default (podman's
	// here), as a kubelet with seccompDefault applies it.
	if sc.SeccompProfile != nil && sc.SeccompProfile.Type == corev1.SeccompProfileTypeUnconfined {
		args = append(args, "--security-opt", "seccomp=unconfined")
	}
	for mountPath, hostPath := range hostPathOf(t, m.ds.Spec.Template.Spec, c) {
		dir, ok := host[hostPath]
		require.True(t, ok, "no test directory for host path %s", hostPath)
		args = append(args, "-v", dir+":"+mountPath)
	}
	args = append(args, "-v", kubeconfig+":/kubeconfig:ro", "-e", agent.EnvKubeconfig+"=/kubeconfig")
	for _, e := range containerEnv(m, c, "node-a") {
		args = append(args, "-e", e)
	}
	entry, err := json.Marshal(c.Command)
	require.NoError(t, err)
	args = append(args, "--entrypoint", string(entry))
	args = append(args, extra...)
	return append(args, image)
}

// TestManifestUnderRuntime starts the DaemonSet's two containers with a
// real container runtime (podman with runc), from the image make image
// builds, with the manifest's command, environment, security context and
// mounts, in a simulated node's network namespace whose loopback holds a
// test API server. The init container installs the plugins (and loopback,
// which the node lacks), runs STATUS
// (the programs pinned in the plugin's bpfRoot through its mount) and
// writes the conflist; the agent starts, in mode direct routes to the
// other node and reports ready on the node's loopback, and in mode vxlan
// writes the tunnel endpoints into the plugin's pinned map through the same
// mount. (A mount under /sys, as the manifest had, fails at the start:
// "mkdir .../sys/fs/bpf/ebpf-cni: no such file or directory".) Then the
// uninstall DaemonSet's containers: the init container refuses while the
// agent answers, and removes everything once it is gone, leaving the
// mounts empty; the other pauses, as nobody, until SIGTERM.
func TestManifestUnderRuntime(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("runc"); err != nil {
		t.Fatal("runc is missing (make deps installs it)")
	}
	m := loadManifest(t)
	install, run := m.containers()
	image, _, _ := makeImage(t)

	a := &simNode{name: "node-a", ip4: net.ParseIP("192.0.2.21"), ip6: net.ParseIP("2001:db8:ffff::21"),
		podCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")}}
	b := &simNode{name: "node-b", ip4: net.ParseIP("192.0.2.22"), ip6: net.ParseIP("2001:db8:ffff::22"),
		podCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24"), netip.MustParsePrefix("fd00:10:244:2::/64")}}
	node, h := lonelyNode(t, a.ip4.String(), a.ip6.String())
	var api *kubetest.Server
	require.NoError(t, node.NS.Do(func(ns.NetNS) (err error) { api, err = kubetest.New(); return err }))
	t.Cleanup(api.Close)
	api.Apply(a.object())
	api.Apply(b.object())
	kc := kubeconfig(t, api)

	bpfRoot := testutil.BPFFS(t)
	require.NoError(t, os.MkdirAll(bpfRoot, 0o755)) // the volume's type: DirectoryOrCreate
	host := map[string]string{
		"/opt/cni/bin":         t.TempDir(),
		"/etc/cni/net.d":       t.TempDir(),
		config.DefaultBPFRoot:  bpfRoot,
		config.DefaultStateDir: t.TempDir(),
	}

	// The init container.
	argv := podRun(t, m, install, image, node.NS.Path(), host, kc, "--rm")
	out, err := exec.Command("podman", argv...).CombinedOutput()
	require.NoError(t, err, "the init container: podman %s\n%s", strings.Join(argv, " "), out)
	require.Contains(t, string(out), "plugin ready (STATUS)")
	bins, err := os.ReadDir(host["/opt/cni/bin"])
	require.NoError(t, err)
	var names []string
	for _, e := range bins {
		names = append(names, e.Name())
	}
	require.Subset(t, names, agent.Plugins)
	require.Contains(t, names, agent.Loopback, "the node had no loopback: the image's is installed")
	require.Contains(t, string(out), "plugin installed (the node had no loopback)")
	programs, err := os.ReadDir(filepath.Join(bpfRoot, "programs"))
	require.NoError(t, err, "STATUS pinned no programs in the plugin's bpfRoot")
	require.NotEmpty(t, programs)
	list, err := os.ReadFile(filepath.Join(host["/etc/cni/net.d"], conflist.DefaultFile))
	require.NoError(t, err, "no conflist")
	require.NotContains(t, string(list), agent.BPFRootMount, "the conflist names the container's path, not the node's")

	// The agent, in each mode.
	startAgent := func(mode string) string {
		id := make([]byte, 4)
		_, _ = rand.Read(id)
		name := "ebpf-cni-test-agent-" + hex.EncodeToString(id)
		argv := podRun(t, m, run, image, node.NS.Path(), host, kc, "-d", "--name", name, "-e", agent.EnvMode+"="+mode)
		out, err := exec.Command("podman", argv...).CombinedOutput()
		t.Cleanup(func() { _ = exec.Command("podman", "rm", "-f", "-t", "0", name).Run() })
		require.NoError(t, err, "the agent container: podman %s\n%s", strings.Join(argv, " "), out)
		return name
	}
	logs := func(name string) string {
		out, _ := exec.Command("podman", "logs", name).CombinedOutput()
		return string(out)
	}
	stop := func(name string) {
		out, err := exec.Command("podman", "rm", "-f", "-t", "0", name).CombinedOutput()
		require.NoError(t, err, "%s", out)
	}

	agentDirect := startAgent("direct")
	require.Eventually(t, func() bool {
		rs, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: agent.DefaultRouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		return err == nil && len(rs) == 2
	}, 60*time.Second, 50*time.Millisecond, "the agent's routes to node-b:\n%s", logs(agentDirect))
	ready := ""
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && !strings.Contains(ready, `"ready":true`); time.Sleep(100 * time.Millisecond) {
		ready = readyz(node.NS, run)
	}
	require.Contains(t, ready, `"ready":true`, "the readiness probe\n%s", logs(agentDirect))
	stop(agentDirect)

	agentVXLAN := startAgent("vxlan")
	require.Eventually(t, func() bool {
		ts, err := cluster.OpenTunnels(nodetest.Handle(t, bpfRoot, host[config.DefaultStateDir]))
		if err != nil {
			return false
		}
		defer ts.Close()
		l, err := ts.List()
		return err == nil && len(l) == 2
	}, 60*time.Second, 50*time.Millisecond, "the agent's tunnel endpoints to node-b, in the plugin's bpfRoot:\n%s", logs(agentVXLAN))

	// The uninstall DaemonSet's containers, from its manifest, on the same
	// host paths: while the agent answers, the init container refuses and
	// changes nothing; once it is gone, it removes what the install and
	// the agents wrote (the direct agent's routes stayed when it stopped)
	// through the same mounts: the mount points stay, empty. The other
	// container pauses, as nobody, until it is stopped.
	uds := loadUninstallManifest(t)
	um := &manifest{ds: uds, config: m.config}
	un, pause := uds.Spec.Template.Spec.InitContainers[0], uds.Spec.Template.Spec.Containers[0]
	uninstall := func() (string, error) {
		argv := podRun(t, um, un, image, node.NS.Path(), host, kc, "--rm")
		out, err := exec.Command("podman", argv...).CombinedOutput()
		return string(out), err
	}
	out2, err := uninstall()
	require.Error(t, err, "uninstall while the agent runs:\n%s", out2)
	require.Contains(t, out2, "the agent of node node-a answers on 127.0.0.1:9965")
	_, err = os.Stat(filepath.Join(host["/etc/cni/net.d"], conflist.DefaultFile))
	require.NoError(t, err, "a refused uninstall removed the conflist")
	stop(agentVXLAN)
	out2, err = uninstall()
	require.NoError(t, err, "the uninstall container:\n%s", out2)
	for _, want := range []string{"removed the agent's route", "removed the agent's tunnel endpoint", "removed the pins under bpfRoot", "removed the install record"} {
		require.Contains(t, out2, want)
	}
	for _, dir := range host {
		left, err := os.ReadDir(dir)
		require.NoError(t, err, "%s: a mount point stays", dir)
		require.Empty(t, left, "%s", dir)
	}
	rs, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: agent.DefaultRouteProtocol}, netlink.RT_FILTER_PROTOCOL)
	require.NoError(t, err)
	require.Empty(t, rs)
	name := "ebpf-cni-test-pause-" + fmt.Sprint(time.Now().UnixNano())
	argv = podRun(t, um, pause, image, node.NS.Path(), host, kc, "-d", "--name", name)
	out, err = exec.Command("podman", argv...).CombinedOutput()
	t.Cleanup(func() { _ = exec.Command("podman", "rm", "-f", "-t", "0", name).Run() })
	require.NoError(t, err, "the pause container: podman %s\n%s", strings.Join(argv, " "), out)
	require.Eventually(t, func() bool { return strings.Contains(logs(name), "pausing until SIGTERM") }, 30*time.Second, 50*time.Millisecond, "%s", logs(name))
	require.Equal(t, "65534", strings.TrimSpace(podman(t, "inspect", "--format", "{{.Config.User}}", name)))
	require.Equal(t, "true", podman(t, "inspect", "--format", "{{.State.Running}}", name), "pause returned:\n%s", logs(name))
	podman(t, "stop", "-t", "10", name) // SIGTERM
	require.Equal(t, "0", strings.TrimSpace(podman(t, "inspect", "--format", "{{.State.ExitCode}}", name)), "pause ends on SIGTERM, successfully")
}

// readyz is the agent's readiness probe, as kubelet sends it on the node.
func readyz(n ns.NetNS, c corev1.Container) string {
	p := c.ReadinessProbe.HTTPGet
	_, body, err := getIn(n, net.JoinHostPort(p.Host, p.Port.String()), p.Path)
	if err != nil {
		return err.Error()
	}
	return body
}
