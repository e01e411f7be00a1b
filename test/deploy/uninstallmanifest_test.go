package deploy_test

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/config"
	"github.com/ebpf-cni/ebpf-cni/pkg/conflist"
)

const uninstallManifest = "deploy/kubernetes/ebpf-cni-uninstall.yaml"

// loadUninstallManifest decodes deploy/kubernetes/ebpf-cni-uninstall.yaml
// strictly: one DaemonSet.
func loadUninstallManifest(t *testing.T) *appsv1.DaemonSet {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testutil.ModuleRoot(), uninstallManifest))
	require.NoError(t, err)
	require.NotContains(t, string(b), "\n---\n", "one document")
	ds := &appsv1.DaemonSet{}
	require.NoError(t, yaml.UnmarshalStrict(b, ds))
	require.Equal(t, "apps/v1", ds.APIVersion)
	require.Equal(t, "DaemonSet", ds.Kind)
	return ds
}

// TestUninstallManifest: the uninstall DaemonSet runs where the ebpf-cni
// DaemonSet runs (every node, whatever its taints, on the host network),
// with its image and exactly its host paths at the same places (the
// uninstall's defaults: the CNI directories, the plugin's bpfRoot and
// stateDir); its init container runs uninstall with the capabilities
// TestUninstallManifestPrivileges shows it needs, its container pause
// with none, as nobody; it asks nothing of the API server. `make
// uninstall-manifest IMAGE=...` prints it with the image replaced and
// nothing else.
func TestUninstallManifest(t *testing.T) {
	m := loadManifest(t)
	install, _ := m.containers()
	ds := loadUninstallManifest(t)
	require.Equal(t, m.ds.Namespace, ds.Namespace)
	require.Equal(t, "ebpf-cni-uninstall", ds.Name)
	require.Equal(t, ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels)
	require.NotEqual(t, m.ds.Spec.Selector.MatchLabels, ds.Spec.Selector.MatchLabels, "the DaemonSets' pods apart")

	spec, ispec := ds.Spec.Template.Spec, m.ds.Spec.Template.Spec
	require.True(t, spec.HostNetwork)
	require.False(t, spec.HostPID || spec.HostIPC)
	require.Equal(t, ispec.PriorityClassName, spec.PriorityClassName)
	require.Equal(t, ispec.Tolerations, spec.Tolerations)
	require.Equal(t, ispec.Volumes, spec.Volumes, "the install DaemonSet's host paths, no more")
	require.Empty(t, spec.ServiceAccountName)
	require.NotNil(t, spec.AutomountServiceAccountToken)
	require.False(t, *spec.AutomountServiceAccountToken, "no API token")

	require.Len(t, spec.InitContainers, 1)
	require.Len(t, spec.Containers, 1)
	un, pause := spec.InitContainers[0], spec.Containers[0]
	require.Equal(t, []string{"/ebpf-cni-agent", "uninstall", "-bpf-root-mount", agent.BPFRootMount}, un.Command)
	require.Equal(t, []string{"/ebpf-cni-agent", "pause"}, pause.Command)
	for _, c := range []corev1.Container{un, pause} {
		require.Equal(t, install.Image, c.Image, c.Name)
		require.Equal(t, install.ImagePullPolicy, c.ImagePullPolicy, c.Name)
		require.Empty(t, c.Env, "%s: uninstall reads no setting", c.Name)
		sc := c.SecurityContext
		require.NotNil(t, sc, c.Name)
		require.True(t, sc.Privileged == nil || !*sc.Privileged, c.Name)
		require.False(t, *sc.AllowPrivilegeEscalation, c.Name)
		require.True(t, *sc.ReadOnlyRootFilesystem, c.Name)
		require.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop, c.Name)
	}
	require.Equal(t, hostPathOf(t, ispec, install), hostPathOf(t, spec, un))
	require.Equal(t, map[string]string{
		agent.DefaultCNIBinDir:  "/opt/cni/bin",
		agent.DefaultCNIConfDir: "/etc/cni/net.d",
		agent.BPFRootMount:      config.DefaultBPFRoot, // -bpf-root's default
		config.DefaultStateDir:  config.DefaultStateDir,
	}, hostPathOf(t, spec, un))
	require.ElementsMatch(t, []corev1.Capability{"BPF", "NET_ADMIN"}, un.SecurityContext.Capabilities.Add)
	require.Equal(t, install.SecurityContext.SeccompProfile, un.SecurityContext.SeccompProfile, "bpf(), as install")
	require.Empty(t, pause.SecurityContext.Capabilities.Add)
	require.Empty(t, pause.VolumeMounts)
	require.True(t, *pause.SecurityContext.RunAsNonRoot)

	out, err := makeTarget(t, "uninstall-manifest", "IMAGE=registry.example/ebpf-cni:v9.9.9")
	require.NoError(t, err, out)
	orig, err := os.ReadFile(filepath.Join(testutil.ModuleRoot(), uninstallManifest))
	require.NoError(t, err)
	require.Equal(t, strings.ReplaceAll(string(orig), "image: "+install.Image, "image: registry.example/ebpf-cni:v9.9.9"), out)
	require.Equal(t, 2, strings.Count(out, "image: registry.example/ebpf-cni:v9.9.9"))
}

// TestUninstallManifestPrivileges runs the uninstall init container's
// command as the manifest runs it (the agent binary, exactly the
// capabilities it grants, in the node's network namespace) on a node that
// the install container set up, with a pod with a hostPort and the agent's
// routes, forced: it succeeds with BPF and NET_ADMIN (the endpoint torn
// down, the uplink's and the cgroup's programs detached, every pin and
// route gone) and fails without either: without BPF the plugin's pinned
// maps do not open, without NET_ADMIN no route or device goes.
func TestUninstallManifestPrivileges(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Fatal("setpriv (util-linux) is missing")
	}
	un := loadUninstallManifest(t).Spec.Template.Spec.InitContainers[0]
	bin := agentBinary(t)
	run := func(caps []corev1.Capability) (*uninstallNode, string, error) {
		u := newUninstallNode(t, conflist.ModeDirect, nil)
		u.runInstall()
		u.addPod()
		d, err := agent.NewDirect(u.h, agent.DefaultRouteProtocol)
		require.NoError(t, err)
		require.NoError(t, d.Ensure(agent.Route{Dst: clusterCIDRs[0], Via: netip.MustParseAddr(nettest.WorldIP4.String())}))
		argv := setpriv(caps, bin, "uninstall", "-cni-bin-dir", u.bin, "-cni-conf-dir", u.conf,
			"-bpf-root", u.bpfRoot, "-state-dir", u.stateDir, "-force")
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
		var out []byte
		require.NoError(t, u.node.NS.Do(func(ns.NetNS) error { out, err = cmd.CombinedOutput(); return nil }))
		return u, string(out), err
	}
	caps := un.SecurityContext.Capabilities.Add
	u, out, err := run(caps)
	require.NoError(t, err, "uninstall with %v:\n%s", caps, out)
	require.Contains(t, out, "ebpf-cni removed from the node")
	u.requireNodeClean(nil)
	for _, c := range caps {
		u, out, err := run(without(caps, c))
		if c == "BPF" && !bpfChecksCapAtEntry(t) {
			// 6.5 and later check CAP_BPF where maps and programs are
			// made, not for each bpf() command: opening the plugin's pins,
			// deleting map entries and unpinning need none.
			require.NoError(t, err, "uninstall without BPF on this kernel:\n%s", out)
			u.requireNodeClean(nil)
			t.Logf("this kernel checks CAP_BPF only where maps and programs are made: uninstall needs BPF on kernels before 6.5 (Debian 12's 6.1, make test-kernel)")
			continue
		}
		require.Error(t, err, "uninstall succeeded without %s: the manifest grants more than needed\n%s", c, out)
		require.Contains(t, out, "operation not permitted")
	}
}

// bpfChecksCapAtEntry reports whether every bpf() command of a process
// without CAP_BPF fails here: kernels before 6.5 refuse them all while
// kernel.unprivileged_bpf_disabled is set (Debian's default), later ones
// only the commands that make maps and programs.
func bpfChecksCapAtEntry(t *testing.T) bool {
	t.Helper()
	var uts unix.Utsname
	require.NoError(t, unix.Uname(&uts))
	var major, minor int
	_, err := fmt.Sscanf(unix.ByteSliceToString(uts.Release[:]), "%d.%d", &major, &minor)
	require.NoError(t, err)
	disabled, err := os.ReadFile("/proc/sys/kernel/unprivileged_bpf_disabled")
	require.NoError(t, err)
	return (major < 6 || major == 6 && minor < 5) && strings.TrimSpace(string(disabled)) != "0"
}
