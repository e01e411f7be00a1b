package deploy_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
)

// The chart, and the one deploy/kubernetes/ebpf-cni.yaml is checked
// against: the manifest stays the file kubectl applies and the tests above
// run under a runtime; the chart must render the same objects with its
// defaults (deploy/helm/ebpf-cni/README.md).
const chartDir = "deploy/helm/ebpf-cni"

// helm runs bin/tools/helm (make deps builds it: make tools) in the module
// root with its own cache and configuration directories, not the user's.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin := filepath.Join(testutil.ModuleRoot(), "bin/tools/helm")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s: %v: make deps installs helm (make tools)", bin, err)
	}
	home := t.TempDir()
	cmd := exec.Command(bin, args...)
	cmd.Dir = testutil.ModuleRoot()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// object is one Kubernetes object as YAML decodes it: comments, order of
// keys and quoting style gone, types ("true" against true) kept.
type object = map[string]any

// objects decodes a multi-document YAML stream into its objects by
// kind/name; a duplicate key, or the same kind and name twice, fails.
func objects(t *testing.T, stream string) map[string]object {
	t.Helper()
	out := map[string]object{}
	for i, doc := range regexp.MustCompile(`(?m)^---[ \t]*$`).Split(stream, -1) {
		var o object
		require.NoError(t, yaml.UnmarshalStrict([]byte(doc), &o), "document %d:\n%s", i, doc)
		if o == nil {
			continue // comments only
		}
		meta, _ := o["metadata"].(map[string]any)
		key := fmt.Sprintf("%v/%v", o["kind"], meta["name"])
		require.NotContains(t, out, key, "document %d", i)
		out[key] = o
	}
	return out
}

// render is the chart rendered as the release ebpf-cni in kube-system,
// with --set args.
func render(t *testing.T, set ...string) map[string]object {
	t.Helper()
	args := []string{"template", "ebpf-cni", chartDir, "--namespace", "kube-system"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := helm(t, args...)
	require.NoError(t, err, out)
	return objects(t, out)
}

func manifestObjects(t *testing.T) map[string]object {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testutil.ModuleRoot(), "deploy/kubernetes/ebpf-cni.yaml"))
	require.NoError(t, err)
	return objects(t, string(b))
}

// typed decodes o into a k8s.io/api type, strictly.
func typed[T any](t *testing.T, o object) *T {
	t.Helper()
	require.NotNil(t, o)
	b, err := json.Marshal(o)
	require.NoError(t, err)
	v := new(T)
	require.NoError(t, yaml.UnmarshalStrict(b, v))
	return v
}

// TestHelmChartDefaultsEqualManifest: the chart with its defaults is the
// plain manifest, object by object, in any order.
func TestHelmChartDefaultsEqualManifest(t *testing.T) {
	want, got := manifestObjects(t), render(t)
	require.ElementsMatch(t, keys(want), keys(got), "the objects of the manifest and of the chart")
	for k, o := range want {
		for _, d := range diff(k, o, got[k]) {
			t.Errorf("the chart's defaults differ from deploy/kubernetes/ebpf-cni.yaml: %s", d)
		}
	}
}

// diff lists where a (the manifest's) and b (the chart's) differ, by path.
func diff(path string, a, b any) []string {
	switch a := a.(type) {
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok {
			break
		}
		var out []string
		for k := range a {
			out = append(out, diff(path+"."+k, a[k], b[k])...)
		}
		for k := range b {
			if _, ok := a[k]; !ok {
				out = append(out, diff(path+"."+k, nil, b[k])...)
			}
		}
		slices.Sort(out)
		return out
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			break
		}
		var out []string
		for i := range a {
			out = append(out, diff(fmt.Sprintf("%s[%d]", path, i), a[i], b[i])...)
		}
		return out
	}
	if reflect.DeepEqual(a, b) {
		return nil
	}
	return []string{fmt.Sprintf("%s: manifest %s, chart %s", path, show(a), show(b))}
}

func show(v any) string {
	if v == nil {
		return "(none)"
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func keys(m map[string]object) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestHelmLint: helm lint --strict passes (warnings fail it), with the
// defaults and with every option on; its only note is the chart's icon.
func TestHelmLint(t *testing.T) {
	for _, set := range [][]string{
		nil,
		{"config.mode=vxlan", "config.vxlanPort=8472", "metrics.serviceMonitor.enabled=true", "image.digest=sha256:0123"},
		{"uninstall=true"},
	} {
		args := []string{"lint", "--strict", chartDir, "--namespace", "kube-system"}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		out, err := helm(t, args...)
		require.NoError(t, err, out)
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "[") {
				require.Equal(t, "[INFO] Chart.yaml: icon is recommended", l, "helm lint %v", set)
			}
		}
	}
}

// chartDaemonSet and chartConfig are the typed DaemonSet and ConfigMap of
// a rendering.
func chartDaemonSet(t *testing.T, objs map[string]object) *appsv1.DaemonSet {
	return typed[appsv1.DaemonSet](t, objs["DaemonSet/ebpf-cni"])
}

func chartConfig(t *testing.T, objs map[string]object) map[string]string {
	return typed[corev1.ConfigMap](t, objs["ConfigMap/ebpf-cni"]).Data
}

// TestHelmChartEveryConfigMapKeyIsAValue: each ConfigMap key the DaemonSet
// reads is a value config.<key> that lands in the ConfigMap (metricsAddr
// comes from metrics.*: TestHelmChartOptions).
func TestHelmChartEveryConfigMapKeyIsAValue(t *testing.T) {
	sample := map[string]string{
		"clusterCIDRs":           "10.32.0.0/12,fd00:32::/48",
		"serviceCIDRs":           "10.100.0.0/16",
		"masquerade":             "false",
		"mode":                   "vxlan",
		"vxlanPort":              "8472",
		"vxlanVNI":               "7",
		"cniVersion":             "0.4.0",
		"mtu":                    "1400",
		"deviceType":             "veth",
		"networkPolicy":          "false",
		"translatedDestinations": "false",
	}
	var set []string
	for k, v := range sample {
		set = append(set, "config."+k+"="+strings.ReplaceAll(v, ",", `\,`))
	}
	objs := render(t, set...)
	spec := chartDaemonSet(t, objs).Spec.Template.Spec
	read := map[string]bool{}
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		for _, e := range c.Env {
			if ref := e.ValueFrom.ConfigMapKeyRef; ref != nil && ref.Key != "metricsAddr" {
				read[ref.Key] = true
			}
		}
	}
	for k := range read {
		require.Contains(t, sample, k, "the DaemonSet reads ConfigMap key %s: give it a value config.%s in the chart and a sample here", k, k)
	}
	data := chartConfig(t, objs)
	for k, v := range sample {
		require.True(t, read[k], "config.%s: no container reads it", k)
		require.Equal(t, v, data[k], "config.%s", k)
	}
}

// TestHelmChartOptions: each value renders what it says, and only that:
// the other objects stay the manifest's.
func TestHelmChartOptions(t *testing.T) {
	manifest := manifestObjects(t)
	for _, tc := range []struct {
		name    string
		set     []string
		changed []string // the manifest's objects it changes
		check   func(t *testing.T, objs map[string]object)
	}{{
		name: "metrics service",
		set:  []string{"metrics.service.enabled=true"},
		check: func(t *testing.T, objs map[string]object) {
			svc := typed[corev1.Service](t, objs["Service/ebpf-cni"])
			require.Equal(t, "kube-system", svc.Namespace)
			require.Equal(t, corev1.ClusterIPNone, svc.Spec.ClusterIP, "headless: one endpoint per node")
			pod := chartDaemonSet(t, objs).Spec.Template
			for k, v := range svc.Spec.Selector {
				require.Equal(t, v, pod.Labels[k], "the Service selects the DaemonSet's pods")
			}
			require.Len(t, svc.Spec.Ports, 1)
			require.Equal(t, "metrics", svc.Spec.Ports[0].TargetPort.String())
			require.EqualValues(t, 9967, svc.Spec.Ports[0].Port)
			require.NotContains(t, objs, "ServiceMonitor/ebpf-cni")
		},
	}, {
		name: "service monitor",
		set:  []string{"metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.release=prom", "metrics.serviceMonitor.interval=15s"},
		check: func(t *testing.T, objs map[string]object) {
			sm := objs["ServiceMonitor/ebpf-cni"]
			require.Equal(t, "monitoring.coreos.com/v1", sm["apiVersion"])
			var m struct {
				Metadata struct {
					Namespace string
					Labels    map[string]string
				}
				Spec struct {
					Selector          struct{ MatchLabels map[string]string }
					NamespaceSelector struct{ MatchNames []string }
					Endpoints         []struct{ Port, Path, Interval, ScrapeTimeout string }
				}
			}
			b, _ := json.Marshal(sm)
			require.NoError(t, json.Unmarshal(b, &m))
			require.Equal(t, "kube-system", m.Metadata.Namespace)
			require.Equal(t, "prom", m.Metadata.Labels["release"])
			svc := typed[corev1.Service](t, objs["Service/ebpf-cni"]) // the ServiceMonitor brings its Service
			require.Equal(t, svc.Labels, m.Spec.Selector.MatchLabels)
			require.Equal(t, []string{"kube-system"}, m.Spec.NamespaceSelector.MatchNames)
			require.Len(t, m.Spec.Endpoints, 1)
			require.Equal(t, svc.Spec.Ports[0].Name, m.Spec.Endpoints[0].Port)
			require.Equal(t, "/metrics", m.Spec.Endpoints[0].Path)
			require.Equal(t, "15s", m.Spec.Endpoints[0].Interval)
		},
	}, {
		name:    "mode vxlan",
		set:     []string{"config.mode=vxlan", "config.vxlanVNI=42"},
		changed: []string{"ConfigMap/ebpf-cni"},
		check: func(t *testing.T, objs map[string]object) {
			d := chartConfig(t, objs)
			require.Equal(t, "vxlan", d["mode"])
			require.Equal(t, "42", d["vxlanVNI"])
			require.NotContains(t, d, "vxlanPort")
		},
	}, {
		name:    "image",
		set:     []string{"image.repository=registry.example/net/ebpf-cni", "image.tag=v1.2.3", "image.pullPolicy=Always"},
		changed: []string{"DaemonSet/ebpf-cni"},
		check: func(t *testing.T, objs map[string]object) {
			spec := chartDaemonSet(t, objs).Spec.Template.Spec
			for _, c := range append(spec.InitContainers, spec.Containers...) {
				require.Equal(t, "registry.example/net/ebpf-cni:v1.2.3", c.Image, c.Name)
				require.Equal(t, corev1.PullAlways, c.ImagePullPolicy, c.Name)
			}
		},
	}, {
		name:    "image digest",
		set:     []string{"image.digest=sha256:abcd"},
		changed: []string{"DaemonSet/ebpf-cni"},
		check: func(t *testing.T, objs map[string]object) {
			spec := chartDaemonSet(t, objs).Spec.Template.Spec
			require.Equal(t, "localhost/ebpf-cni@sha256:abcd", spec.Containers[0].Image)
			require.Equal(t, "localhost/ebpf-cni@sha256:abcd", spec.InitContainers[0].Image)
		},
	}, {
		name:    "metrics port",
		set:     []string{"metrics.port=9100", "metrics.service.enabled=true"},
		changed: []string{"ConfigMap/ebpf-cni", "DaemonSet/ebpf-cni"},
		check: func(t *testing.T, objs map[string]object) {
			require.Equal(t, ":9100", chartConfig(t, objs)["metricsAddr"])
			ds := chartDaemonSet(t, objs)
			require.EqualValues(t, 9100, ds.Spec.Template.Spec.Containers[0].Ports[0].ContainerPort)
			require.Equal(t, "9100", ds.Spec.Template.Annotations["prometheus.io/port"])
			require.EqualValues(t, 9100, typed[corev1.Service](t, objs["Service/ebpf-cni"]).Spec.Ports[0].Port)
		},
	}, {
		name:    "metrics off",
		set:     []string{"metrics.enabled=false"},
		changed: []string{"ConfigMap/ebpf-cni", "DaemonSet/ebpf-cni"},
		check: func(t *testing.T, objs map[string]object) {
			require.Equal(t, "off", chartConfig(t, objs)["metricsAddr"])
			ds := chartDaemonSet(t, objs)
			require.Empty(t, ds.Spec.Template.Spec.Containers[0].Ports)
			require.Empty(t, ds.Spec.Template.Annotations)
		},
	}, {
		name:    "health port",
		set:     []string{"health.port=9000"},
		changed: []string{"DaemonSet/ebpf-cni"},
		check: func(t *testing.T, objs map[string]object) {
			run := chartDaemonSet(t, objs).Spec.Template.Spec.Containers[0]
			require.Equal(t, []string{"/ebpf-cni-agent", "run", "-bpf-root", agent.BPFRootMount, "-health-addr", "127.0.0.1:9000"}, run.Command)
			require.Equal(t, "9000", run.ReadinessProbe.HTTPGet.Port.String())
			require.Equal(t, "9000", run.LivenessProbe.HTTPGet.Port.String())
		},
	}, {
		name:    "host paths",
		set:     []string{"hostPaths.cniBinDir=/home/kubernetes/bin", "hostPaths.cniConfDir=/etc/cni/conf.d", "hostPaths.bpfRoot=/sys/fs/bpf/cni", "hostPaths.stateDir=/var/run/cni-state"},
		changed: []string{"DaemonSet/ebpf-cni"},
		check: func(t *testing.T, objs map[string]object) {
			spec := chartDaemonSet(t, objs).Spec.Template.Spec
			install, run := spec.InitContainers[0], spec.Containers[0]
			// The conflist names the node's bpfRoot and stateDir; the
			// plugin (install's STATUS) and the agent find the stateDir at
			// the node's path, the bpfRoot at /bpf-root.
			require.Equal(t, []string{"/ebpf-cni-agent", "install", "-bpf-root-mount", agent.BPFRootMount, "-bpf-root", "/sys/fs/bpf/cni", "-state-dir", "/var/run/cni-state"}, install.Command)
			require.Equal(t, []string{"/ebpf-cni-agent", "run", "-bpf-root", agent.BPFRootMount, "-state-dir", "/var/run/cni-state"}, run.Command)
			require.Equal(t, map[string]string{
				agent.DefaultCNIBinDir:  "/home/kubernetes/bin",
				agent.DefaultCNIConfDir: "/etc/cni/conf.d",
				agent.BPFRootMount:      "/sys/fs/bpf/cni",
				"/var/run/cni-state":    "/var/run/cni-state",
			}, hostPathOf(t, spec, install))
			require.Equal(t, map[string]string{
				agent.BPFRootMount:   "/sys/fs/bpf/cni",
				"/var/run/cni-state": "/var/run/cni-state",
			}, hostPathOf(t, spec, run))
		},
	}, {
		name:    "scheduling",
		set:     []string{"nodeSelector.kubernetes\\.io/os=linux", "priorityClassName=", "tolerations=null", "resources.limits.memory=128Mi", "installResources.requests.cpu=5m"},
		changed: []string{"DaemonSet/ebpf-cni"},
		check: func(t *testing.T, objs map[string]object) {
			spec := chartDaemonSet(t, objs).Spec.Template.Spec
			require.Equal(t, map[string]string{"kubernetes.io/os": "linux"}, spec.NodeSelector)
			require.Empty(t, spec.PriorityClassName)
			require.Empty(t, spec.Tolerations)
			require.Equal(t, "128Mi", spec.Containers[0].Resources.Limits.Memory().String())
			require.Equal(t, "32Mi", spec.Containers[0].Resources.Requests.Memory().String(), "the defaults' requests stay")
			require.Equal(t, "5m", spec.InitContainers[0].Resources.Requests.Cpu().String())
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, tc.set...)
			tc.check(t, objs)
			for k, o := range manifest {
				if !slices.Contains(tc.changed, k) {
					require.Equal(t, o, objs[k], "%s: changed by %v", k, tc.set)
				}
			}
			for _, k := range tc.changed {
				require.NotEqual(t, manifest[k], objs[k], "%s: unchanged by %v", k, tc.set)
			}
		})
	}
}

// TestHelmChartUninstall: uninstall=true renders, instead of every object
// of ebpf-cni, deploy/kubernetes/ebpf-cni-uninstall.yaml, object for
// object; with other paths, health port, image and scheduling it takes
// them as the DaemonSet it replaces did: the same volumes, the uninstall
// told the node's bpfRoot, the stateDir at its path and where the agent
// answers.
func TestHelmChartUninstall(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testutil.ModuleRoot(), uninstallManifest))
	require.NoError(t, err)
	want, got := objects(t, string(b)), render(t, "uninstall=true")
	require.ElementsMatch(t, keys(want), keys(got), "the objects of the uninstall manifest and of the chart")
	for k, o := range want {
		for _, d := range diff(k, o, got[k]) {
			t.Errorf("the chart's uninstall differs from %s: %s", uninstallManifest, d)
		}
	}

	set := []string{"hostPaths.cniBinDir=/home/kubernetes/bin", "hostPaths.cniConfDir=/etc/cni/conf.d", "hostPaths.bpfRoot=/sys/fs/bpf/cni",
		"hostPaths.stateDir=/var/run/cni-state", "health.port=9000", "image.tag=v1.2.3", "nodeSelector.kubernetes\\.io/os=linux"}
	installed := chartDaemonSet(t, render(t, set...)).Spec.Template.Spec
	objs := render(t, append(set, "uninstall=true")...)
	require.Len(t, objs, 1)
	spec := typed[appsv1.DaemonSet](t, objs["DaemonSet/ebpf-cni-uninstall"]).Spec.Template.Spec
	require.Equal(t, installed.Volumes, spec.Volumes)
	require.Equal(t, installed.NodeSelector, spec.NodeSelector)
	un := spec.InitContainers[0]
	require.Equal(t, []string{"/ebpf-cni-agent", "uninstall", "-bpf-root-mount", agent.BPFRootMount, "-bpf-root", "/sys/fs/bpf/cni",
		"-state-dir", "/var/run/cni-state", "-health-addr", "127.0.0.1:9000"}, un.Command)
	require.Equal(t, hostPathOf(t, installed, installed.InitContainers[0]), hostPathOf(t, spec, un))
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		require.Equal(t, installed.InitContainers[0].Image, c.Image, c.Name)
	}
}

// TestHelmChartRefuses: a value the agent would refuse, or a typo, fails
// the install instead of every node's init container.
func TestHelmChartRefuses(t *testing.T) {
	for set, why := range map[string]string{
		"config.mode=vxaln":                                  "value must be one of 'direct', 'vxlan'",
		"confg.mode=vxlan":                                   "additional properties 'confg' not allowed",
		"config.vxlanPort=8472":                              "config.vxlanPort and config.vxlanVNI are for config.mode vxlan only",
		"config.masquerade=yes":                              "/config/masquerade",
		"config.deviceType=Netkit":                           "/config/deviceType",
		"hostPaths.stateDir=run/ebpf-cni":                    "/hostPaths/stateDir",
		"metrics.port=99999":                                 "/metrics/port",
		"metrics.enabled=false,metrics.service.enabled=true": "metrics.service and metrics.serviceMonitor need metrics.enabled",
	} {
		out, err := helm(t, "template", "ebpf-cni", chartDir, "--namespace", "kube-system", "--set", set)
		require.Error(t, err, "--set %s", set)
		require.Contains(t, out, why, "--set %s", set)
	}
}
