package deploy_test

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/config"
	"github.com/ebpf-cni/ebpf-cni/pkg/conflist"
)

// manifest is deploy/kubernetes/ebpf-cni.yaml decoded strictly.
type manifest struct {
	sa      *corev1.ServiceAccount
	role    *rbacv1.ClusterRole
	binding *rbacv1.ClusterRoleBinding
	config  *corev1.ConfigMap
	ds      *appsv1.DaemonSet
}

// loadManifest decodes every document of the manifest into its k8s.io/api
// type; an unknown or duplicate field, or an unknown kind, fails the test.
func loadManifest(t *testing.T) *manifest {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testutil.ModuleRoot(), "deploy/kubernetes/ebpf-cni.yaml"))
	require.NoError(t, err)
	m := &manifest{}
	for i, doc := range strings.Split(string(b), "\n---\n") {
		var tm metav1.TypeMeta
		require.NoError(t, yaml.Unmarshal([]byte(doc), &tm), "document %d", i)
		var obj any
		switch tm.APIVersion + " " + tm.Kind {
		case "v1 ServiceAccount":
			m.sa = &corev1.ServiceAccount{}
			obj = m.sa
		case "rbac.authorization.k8s.io/v1 ClusterRole":
			m.role = &rbacv1.ClusterRole{}
			obj = m.role
		case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
			m.binding = &rbacv1.ClusterRoleBinding{}
			obj = m.binding
		case "v1 ConfigMap":
			m.config = &corev1.ConfigMap{}
			obj = m.config
		case "apps/v1 DaemonSet":
			m.ds = &appsv1.DaemonSet{}
			obj = m.ds
		default:
			t.Fatalf("document %d: unexpected %s %s", i, tm.APIVersion, tm.Kind)
		}
		require.NoError(t, yaml.UnmarshalStrict([]byte(doc), obj), "document %d (%s)", i, tm.Kind)
	}
	require.NotNil(t, m.sa)
	require.NotNil(t, m.role)
	require.NotNil(t, m.binding)
	require.NotNil(t, m.config)
	require.NotNil(t, m.ds)
	return m
}

// containers are the DaemonSet's init container and its agent.
func (m *manifest) containers() (install, run corev1.Container) {
	spec := m.ds.Spec.Template.Spec
	return spec.InitContainers[0], spec.Containers[0]
}

// The strict decoding catches what a typo would do silently.
func TestManifestDecodingIsStrict(t *testing.T) {
	var ds appsv1.DaemonSet
	require.ErrorContains(t, yaml.UnmarshalStrict([]byte("apiVersion: apps/v1\nkind: DaemonSet\nspec:\n  template:\n    spec:\n      hostNetwrok: true\n"), &ds), "unknown field")
	require.Error(t, yaml.UnmarshalStrict([]byte("apiVersion: v1\nkind: ConfigMap\ndata:\n  mode: direct\n  mode: vxlan\n"), &corev1.ConfigMap{}), "duplicate key")
}

// TestManifest: the objects fit together, the RBAC is what the agent reads
// and nothing more, the DaemonSet runs everywhere on the host network, its
// ConfigMap values are ones the agent accepts, and every variable it sets
// is one the agent reads.
func TestManifest(t *testing.T) {
	m := loadManifest(t)
	ns := m.ds.Namespace
	require.Equal(t, "kube-system", ns)
	for _, o := range []metav1.ObjectMeta{m.sa.ObjectMeta, m.config.ObjectMeta} {
		require.Equal(t, ns, o.Namespace, o.Name)
	}

	// RBAC: read Nodes, Services (the translated destinations), and for
	// the network policies the policies (and ClusterNetworkPolicies), pods
	// and namespaces; nothing else.
	require.Equal(t, []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"pods", "namespaces", "services"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"policy.networking.k8s.io"}, Resources: []string{"clusternetworkpolicies"}, Verbs: []string{"list", "watch"}},
	}, m.role.Rules)
	require.Equal(t, rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: m.role.Name}, m.binding.RoleRef)
	require.Equal(t, []rbacv1.Subject{{Kind: "ServiceAccount", Name: m.sa.Name, Namespace: ns}}, m.binding.Subjects)

	spec := m.ds.Spec.Template.Spec
	require.Equal(t, m.sa.Name, spec.ServiceAccountName)
	require.True(t, spec.HostNetwork)
	require.False(t, spec.HostPID || spec.HostIPC)
	require.Equal(t, "system-node-critical", spec.PriorityClassName)
	require.Contains(t, spec.Tolerations, corev1.Toleration{Operator: corev1.TolerationOpExists}, "a toleration of every taint")
	require.Equal(t, m.ds.Spec.Selector.MatchLabels, m.ds.Spec.Template.Labels)
	require.Len(t, spec.InitContainers, 1)
	require.Len(t, spec.Containers, 1)
	install, run := m.containers()
	require.Equal(t, []string{"/ebpf-cni-agent", "install", "-bpf-root-mount", agent.BPFRootMount}, install.Command)
	require.Equal(t, []string{"/ebpf-cni-agent", "run", "-bpf-root", agent.BPFRootMount}, run.Command)
	require.Equal(t, install.Image, run.Image)
	require.Equal(t, corev1.PullIfNotPresent, run.ImagePullPolicy, "an image loaded onto the nodes needs no registry")

	// Every variable: one the agent reads, from the node or the ConfigMap,
	// and the ConfigMap has each key that is not optional.
	for _, c := range []corev1.Container{install, run} {
		names := map[string]bool{}
		for _, e := range c.Env {
			require.Contains(t, agent.EnvVars, e.Name, "%s sets %s, which the agent does not read", c.Name, e.Name)
			names[e.Name] = true
			require.NotNil(t, e.ValueFrom, e.Name)
			if e.Name == agent.EnvNodeName {
				require.Equal(t, "spec.nodeName", e.ValueFrom.FieldRef.FieldPath)
				continue
			}
			ref := e.ValueFrom.ConfigMapKeyRef
			require.NotNil(t, ref, e.Name)
			require.Equal(t, m.config.Name, ref.Name)
			if _, ok := m.config.Data[ref.Key]; !ok {
				require.True(t, ref.Optional != nil && *ref.Optional, "%s: key %s is missing from the ConfigMap", e.Name, ref.Key)
			}
		}
		require.True(t, names[agent.EnvNodeName], c.Name)
		require.True(t, names[agent.EnvMode], c.Name)
	}

	// The ConfigMap's values are ones the agent takes.
	d := m.config.Data
	_, err := conflist.ParseCIDRs("clusterCIDRs", d["clusterCIDRs"])
	require.NoError(t, err)
	_, err = conflist.ParseCIDRs("serviceCIDRs", d["serviceCIDRs"])
	require.NoError(t, err)
	_, err = strconv.ParseBool(d["masquerade"])
	require.NoError(t, err)
	mode, err := conflist.ParseMode(d["mode"])
	require.NoError(t, err)
	require.Equal(t, conflist.ModeDirect, mode, "the default mode is one the agent runs")
	require.Equal(t, conflist.DefaultVersion, d["cniVersion"])

	// Metrics: the agent's default port, exposed and annotated for scraping.
	_, mport, err := net.SplitHostPort(agent.DefaultMetricsAddr)
	require.NoError(t, err)
	require.Len(t, run.Ports, 1)
	require.Equal(t, "metrics", run.Ports[0].Name)
	require.Equal(t, mport, strconv.Itoa(int(run.Ports[0].ContainerPort)))
	ann := m.ds.Spec.Template.Annotations
	require.Equal(t, "true", ann["prometheus.io/scrape"])
	require.Equal(t, mport, ann["prometheus.io/port"])
	require.Equal(t, "/metrics", ann["prometheus.io/path"])

	// Health probes where the agent listens, on the node's loopback.
	_, port, err := net.SplitHostPort(agent.DefaultHealthAddr)
	require.NoError(t, err)
	for probe, path := range map[*corev1.Probe]string{run.ReadinessProbe: "/readyz", run.LivenessProbe: "/healthz"} {
		require.NotNil(t, probe)
		require.Equal(t, "127.0.0.1", probe.HTTPGet.Host)
		require.Equal(t, port, probe.HTTPGet.Port.String())
		require.Equal(t, path, probe.HTTPGet.Path)
	}
}

// hostPathOf maps a container's mount paths to the host paths behind them.
func hostPathOf(t *testing.T, spec corev1.PodSpec, c corev1.Container) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, vm := range c.VolumeMounts {
		i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name })
		require.GreaterOrEqual(t, i, 0, vm.Name)
		require.NotNil(t, spec.Volumes[i].HostPath, vm.Name)
		require.Empty(t, vm.SubPath)
		require.Nil(t, vm.MountPropagation, "%s: no mount needs to propagate", vm.Name)
		out[vm.MountPath] = spec.Volumes[i].HostPath.Path
	}
	return out
}

// TestManifestMountsWhatThePluginNeeds: the DaemonSet mounts exactly the
// host paths its containers use, at the paths the code uses: the init
// container the node's CNI directories (where install copies and writes),
// the plugin's default bpfRoot and its default stateDir (the STATUS it runs
// loads the programs there); the agent the plugin's default bpfRoot and
// stateDir (mode vxlan: the tunnel endpoints' map and the lock its writers
// share; the metrics in either mode: the datapath's maps and the plugin's
// call record). Nothing is mounted under /sys, where a runtime mounts a
// read-only sysfs and cannot make a mount point (TestManifestUnderRuntime
// starts the containers). Privileges: exactly the capabilities
// TestManifestPrivileges shows are needed, the agent's being those of both
// modes (the mode is a ConfigMap value read at run time), of which it keeps
// its mode's.
func TestManifestMountsWhatThePluginNeeds(t *testing.T) {
	m := loadManifest(t)
	spec := m.ds.Spec.Template.Spec
	install, run := m.containers()

	require.Equal(t, map[string]string{
		agent.DefaultCNIBinDir:  "/opt/cni/bin",
		agent.DefaultCNIConfDir: "/etc/cni/net.d",
		agent.BPFRootMount:      config.DefaultBPFRoot,
		config.DefaultStateDir:  config.DefaultStateDir,
	}, hostPathOf(t, spec, install))
	require.Equal(t, map[string]string{
		agent.BPFRootMount:     config.DefaultBPFRoot,
		config.DefaultStateDir: config.DefaultStateDir,
	}, hostPathOf(t, spec, run))
	for _, c := range []corev1.Container{install, run} {
		for _, vm := range c.VolumeMounts {
			require.False(t, strings.HasPrefix(vm.MountPath, "/sys/"), "%s mounts %s under /sys", c.Name, vm.MountPath)
		}
	}
	require.Len(t, spec.Volumes, 4, "a volume no container mounts")
	for _, v := range spec.Volumes {
		require.NotNil(t, v.HostPath, v.Name)
	}

	for _, c := range []corev1.Container{install, run} {
		sc := c.SecurityContext
		require.NotNil(t, sc, c.Name)
		require.True(t, sc.Privileged == nil || !*sc.Privileged, c.Name)
		require.NotNil(t, sc.AllowPrivilegeEscalation)
		require.False(t, *sc.AllowPrivilegeEscalation, c.Name)
		require.NotNil(t, sc.ReadOnlyRootFilesystem)
		require.True(t, *sc.ReadOnlyRootFilesystem, c.Name)
		require.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop, c.Name)
	}
	require.ElementsMatch(t, []corev1.Capability{"BPF", "PERFMON", "NET_ADMIN"}, install.SecurityContext.Capabilities.Add)
	require.ElementsMatch(t, []corev1.Capability{"NET_ADMIN", "BPF"}, run.SecurityContext.Capabilities.Add)
}
