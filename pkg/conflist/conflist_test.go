package conflist

import (
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/cluster"
	"github.com/ebpf-cni/ebpf-cni/pkg/clusterranges"
	"github.com/ebpf-cni/ebpf-cni/pkg/ipam"
	"github.com/ebpf-cni/ebpf-cni/pkg/nat"
	"github.com/ebpf-cni/ebpf-cni/pkg/plugin"
	"github.com/ebpf-cni/ebpf-cni/pkg/portmap"
)

func prefixes(t *testing.T, s string) []netip.Prefix {
	t.Helper()
	p, err := ParseCIDRs("test", s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// decoded is what a test reads back from Build's output.
type decoded struct {
	CNIVersion  string   `json:"cniVersion"`
	CNIVersions []string `json:"cniVersions"`
	Name        string   `json:"name"`
	Plugins     []struct {
		Type         string          `json:"type"`
		MTU          int             `json:"mtu"`
		DeviceType   string          `json:"deviceType"`
		BPFRoot      string          `json:"bpfRoot"`
		StateDir     string          `json:"stateDir"`
		IPMasq       bool            `json:"ipMasq"`
		ClusterCIDRs []string        `json:"clusterCIDRs"`
		Overlay      string          `json:"overlay"`
		VXLANPort    int             `json:"vxlanPort"`
		VXLANVNI     int             `json:"vxlanVNI"`
		Capabilities map[string]bool `json:"capabilities"`
		IPAM         struct {
			Type   string                `json:"type"`
			Ranges [][]map[string]string `json:"ranges"`
		} `json:"ipam"`
	} `json:"plugins"`
}

func build(t *testing.T, o Options) (decoded, []byte) {
	t.Helper()
	b, err := Build(o)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	var d decoded
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	return d, b
}

func TestBuildSingleNode(t *testing.T) {
	d, b := build(t, Options{PodCIDRs: prefixes(t, "10.244.1.0/24"), Masquerade: true})
	if d.CNIVersion != "1.0.0" || strings.Join(d.CNIVersions, ",") != "1.0.0,1.1.0" || d.Name != "ebpf-cni" || len(d.Plugins) != 1 {
		t.Fatalf("header: %s", b)
	}
	p := d.Plugins[0]
	if p.Type != "ebpf-cni" || !p.IPMasq || p.IPAM.Type != "ebpf-ipam" {
		t.Fatalf("plugin: %s", b)
	}
	for _, c := range []string{"ips", "mac", "portMappings", "bandwidth"} {
		if !p.Capabilities[c] {
			t.Errorf("capability %q missing: %s", c, b)
		}
	}
	if len(p.IPAM.Ranges) != 1 || p.IPAM.Ranges[0][0]["subnet"] != "10.244.1.0/24" {
		t.Errorf("ranges: %v", p.IPAM.Ranges)
	}
	if p.ClusterCIDRs != nil || p.Overlay != "" || p.BPFRoot != "" || p.StateDir != "" || p.MTU != 0 || strings.Contains(string(b), "deviceType") {
		t.Errorf("keys written without being asked for: %s", b)
	}
	if !strings.HasSuffix(string(b), "}\n") {
		t.Errorf("no trailing newline")
	}
}

func TestBuildDualStackCluster(t *testing.T) {
	d, _ := build(t, Options{
		CNIVersion:   "1.1.0",
		Name:         "k8s-pod-network",
		PodCIDRs:     prefixes(t, "fd00:10:244:1::/64, 10.244.1.0/24"),
		ClusterCIDRs: prefixes(t, "10.244.0.0/16"),
		ServiceCIDRs: prefixes(t, "10.96.0.0/12,fd00:10:96::/112"),
		Masquerade:   true,
		MTU:          1450,
		DeviceType:   "veth",
		BPFRoot:      "/sys/fs/bpf/x",
		StateDir:     "/run/x",
	})
	p := d.Plugins[0]
	if d.CNIVersion != "1.1.0" || strings.Join(d.CNIVersions, ",") != "1.1.0" || d.Name != "k8s-pod-network" || p.MTU != 1450 || p.DeviceType != "veth" || p.BPFRoot != "/sys/fs/bpf/x" || p.StateDir != "/run/x" {
		t.Errorf("options not written: %+v", d)
	}
	// One range set per family, in the order given (the primary family first).
	if len(p.IPAM.Ranges) != 2 || p.IPAM.Ranges[0][0]["subnet"] != "fd00:10:244:1::/64" || p.IPAM.Ranges[1][0]["subnet"] != "10.244.1.0/24" {
		t.Errorf("ranges: %v", p.IPAM.Ranges)
	}
	// The cluster's ranges as the plugin's key; direct mode: no overlay.
	if got := strings.Join(p.ClusterCIDRs, ","); got != "10.244.0.0/16" || p.Overlay != "" || p.VXLANPort != 0 || p.VXLANVNI != 0 {
		t.Errorf("clusterCIDRs = %s, overlay %q %d %d", got, p.Overlay, p.VXLANPort, p.VXLANVNI)
	}
}

func TestBuildVXLAN(t *testing.T) {
	o := Options{PodCIDRs: prefixes(t, "10.244.1.0/24"), ClusterCIDRs: prefixes(t, "10.244.0.0/16,fd00:10:244::/56"), Mode: ModeVXLAN, Masquerade: true}
	d, b := build(t, o)
	p := d.Plugins[0]
	if p.Overlay != "vxlan" || strings.Join(p.ClusterCIDRs, ",") != "10.244.0.0/16,fd00:10:244::/56" || p.MTU != 0 {
		t.Errorf("vxlan mode: %s", b)
	}
	if strings.Contains(string(b), "vxlanPort") || strings.Contains(string(b), "vxlanVNI") {
		t.Errorf("the overlay's defaults written: %s", b)
	}
	o.VXLANPort, o.VXLANVNI = 8472, 42
	d, b = build(t, o)
	if p := d.Plugins[0]; p.VXLANPort != 8472 || p.VXLANVNI != 42 {
		t.Errorf("port and VNI: %s", b)
	}
}

func TestBuildErrorsNameTheOption(t *testing.T) {
	pod := prefixes(t, "10.244.1.0/24")
	for _, tc := range []struct {
		name string
		o    Options
		key  string
		msg  string
	}{
		{"no pod range", Options{}, "podCIDRs", "required"},
		{"two of a family", Options{PodCIDRs: prefixes(t, "10.244.1.0/24,10.245.1.0/24")}, "podCIDRs", "at most one range per family"},
		{"too small", Options{PodCIDRs: prefixes(t, "10.244.1.0/31")}, "podCIDRs", "too few"},
		{"version", Options{PodCIDRs: pod, CNIVersion: "0.2.0"}, "cniVersion", "want one of"},
		{"name", Options{PodCIDRs: pod, Name: "a/b"}, "name", "not a network name"},
		{"service overlaps", Options{PodCIDRs: pod, ServiceCIDRs: prefixes(t, "10.244.0.0/16")}, "serviceCIDRs", "overlaps"},
		{"mode", Options{PodCIDRs: pod, Mode: "bgp"}, "mode", "direct or vxlan"},
		{"vxlan without the cluster's ranges", Options{PodCIDRs: pod, Mode: ModeVXLAN}, "clusterCIDRs", "mode vxlan needs the cluster's pod ranges"},
		{"every address", Options{PodCIDRs: pod, ClusterCIDRs: prefixes(t, "0.0.0.0/0")}, "clusterCIDRs", "covers every address"},
		{"port without vxlan", Options{PodCIDRs: pod, VXLANPort: 8472}, "vxlanPort", "without mode vxlan"},
		{"VNI without vxlan", Options{PodCIDRs: pod, Mode: ModeDirect, VXLANVNI: 2}, "vxlanVNI", "without mode vxlan"},
		{"port", Options{PodCIDRs: pod, ClusterCIDRs: pod, Mode: ModeVXLAN, VXLANPort: 65536}, "vxlanPort", "outside 1..65535"},
		{"VNI", Options{PodCIDRs: pod, ClusterCIDRs: pod, Mode: ModeVXLAN, VXLANVNI: 1 << 24}, "vxlanVNI", "outside 1..16777215"},
		{"mtu", Options{PodCIDRs: pod, MTU: 20}, "mtu", "outside"},
		{"deviceType", Options{PodCIDRs: pod, DeviceType: "Veth"}, "deviceType", `unknown device type "Veth" (want auto, netkit or veth)`},
		{"bpfRoot", Options{PodCIDRs: pod, BPFRoot: "rel"}, "bpfRoot", "absolute"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Build(tc.o)
			var oe *OptionError
			if !errors.As(err, &oe) || oe.Key != tc.key || !strings.Contains(oe.Msg, tc.msg) {
				t.Fatalf("got %v, want an error about %s saying %q", err, tc.key, tc.msg)
			}
		})
	}
}

// TestDeviceTypes: each deviceType Build writes is one the plugin knows
// (netkit it may refuse on this kernel, not as unknown), and one Build
// refuses the plugin refuses too.
func TestDeviceTypes(t *testing.T) {
	pluginParse := func(t *testing.T, b []byte) error {
		t.Helper()
		list, err := libcni.ConfListFromBytes(b)
		require.NoError(t, err)
		stdin, err := json.Marshal(mergeHeader(t, list.Plugins[0].Bytes, list))
		require.NoError(t, err)
		_, err = plugin.ParseConfig(stdin, "", true)
		return err
	}
	pod := prefixes(t, "10.244.1.0/24")
	for _, dt := range DeviceTypes {
		d, b := build(t, Options{PodCIDRs: pod, DeviceType: dt})
		require.Equal(t, dt, d.Plugins[0].DeviceType)
		if err := pluginParse(t, b); err != nil {
			require.Equal(t, "netkit", dt, "the plugin refuses deviceType %s: %v", dt, err)
			require.NotContains(t, err.Error(), "unknown device type")
		}
	}
	_, err := Build(Options{PodCIDRs: pod, DeviceType: "macvlan"})
	var oe *OptionError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, "deviceType", oe.Key)
	_, b := build(t, Options{PodCIDRs: pod})
	require.NotContains(t, string(b), "deviceType")
	b = []byte(strings.Replace(string(b), `"type": "ebpf-cni",`, `"type": "ebpf-cni", "deviceType": "macvlan",`, 1))
	require.ErrorContains(t, pluginParse(t, b), "unknown device type")
}

func TestParseCIDRs(t *testing.T) {
	if _, err := ParseCIDRs("POD_CIDR", "10.244.1.7/24"); err == nil || !strings.Contains(err.Error(), "did you mean 10.244.1.0/24") {
		t.Errorf("host address accepted or unhelpful: %v", err)
	}
	if _, err := ParseCIDRs("POD_CIDR", "10.244.1.0"); err == nil || !strings.Contains(err.Error(), "invalid POD_CIDR") {
		t.Errorf("address without length: %v", err)
	}
	if p, err := ParseCIDRs("x", " 10.0.0.0/8 ,, fd00::/8 "); err != nil || len(p) != 2 {
		t.Errorf("got %v, %v", p, err)
	}
}

// The conflist Build writes is one the runtimes' library loads and whose
// keys the plugins read as meant, in both modes.
func TestBuildLoadsAndParses(t *testing.T) {
	for _, mode := range []Mode{ModeDirect, ModeVXLAN} {
		t.Run(string(mode), func(t *testing.T) {
			o := Options{PodCIDRs: prefixes(t, "10.244.1.0/24,fd00:10:244:1::/64"), ClusterCIDRs: prefixes(t, "10.244.0.0/16,fd00:10:244::/56"), Masquerade: true, Mode: mode}
			if mode == ModeVXLAN {
				o.VXLANPort, o.VXLANVNI = 8472, 42
			}
			_, b := build(t, o)
			list, err := libcni.ConfListFromBytes(b)
			if err != nil {
				t.Fatalf("libcni: %v", err)
			}
			// What libcni hands the plugin: the list's name and version,
			// the capabilities turned into runtimeConfig.
			conf, err := libcni.InjectConf(list.Plugins[0], map[string]any{"runtimeConfig": map[string]any{
				"portMappings": []map[string]any{{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}},
				"ips":          []string{"10.244.1.9"},
			}})
			if err != nil {
				t.Fatal(err)
			}
			stdin, err := json.Marshal(mergeHeader(t, conf.Bytes, list))
			if err != nil {
				t.Fatal(err)
			}
			c, err := plugin.ParseConfig(stdin, "", true)
			if err != nil {
				t.Fatalf("ebpf-cni rejects the conflist: %v", err)
			}
			// What the features read of it (each reads its own keys).
			var natKeys nat.Config
			var clusterKeys cluster.Config
			var ports struct {
				RuntimeConfig struct {
					PortMappings []portmap.Mapping `json:"portMappings"`
				} `json:"runtimeConfig"`
			}
			for _, v := range []any{&natKeys, &clusterKeys, &ports} {
				if err := json.Unmarshal(stdin, v); err != nil {
					t.Fatal(err)
				}
			}
			masq, err := natKeys.Validate()
			if err != nil {
				t.Fatal(err)
			}
			cl, err := clusterKeys.Validate()
			if err != nil {
				t.Fatal(err)
			}
			// nonMasqueradeCIDRs at its default (the node's ranges), the
			// cluster's ranges exempt on top (masquerade reads them too).
			if !masq.Enabled || masq.Skip != nil || len(clusterranges.Of(stdin)) != 2 || len(ports.RuntimeConfig.PortMappings) == 0 {
				t.Errorf("ebpf-cni read masquerade %+v, hostPorts %+v", masq, ports.RuntimeConfig.PortMappings)
			}
			if !cl.Enabled() || len(cl.Ranges) != 2 || cl.VXLAN != (mode == ModeVXLAN) {
				t.Errorf("ebpf-cni read the cluster as %+v", cl)
			}
			if mode == ModeVXLAN && (cl.Port != 8472 || cl.VNI != 42) {
				t.Errorf("overlay port %d, VNI %d", cl.Port, cl.VNI)
			}
			ic, _, err := ipam.ParseConfig(c.IPAMConf, "")
			if err != nil {
				t.Fatalf("ebpf-ipam rejects the conflist: %v", err)
			}
			if len(ic.RangeSets) != 2 || len(ic.Requested) != 1 {
				t.Errorf("ebpf-ipam read %d range sets, requested %v", len(ic.RangeSets), ic.Requested)
			}
		})
	}
}

// TestCNIVersionsUnderLibcni: the versions a runtime takes from what Build
// writes. libcni v1.2 and newer (containerd 2.x) read cniVersions and take
// its highest entry they know, 1.1.0, which is when containerd calls STATUS;
// libcni v1.1 and older (containerd 1.6 and 1.7, podman 4) do not know the
// key and read cniVersion, here with the key removed as they ignore it.
func TestCNIVersionsUnderLibcni(t *testing.T) {
	for _, v := range Versions {
		b, err := Build(Options{CNIVersion: v, PodCIDRs: prefixes(t, "10.244.1.0/24")})
		if err != nil {
			t.Fatal(err)
		}
		list, err := libcni.ConfListFromBytes(b)
		if err != nil {
			t.Fatalf("libcni rejects the %s list: %v", v, err)
		}
		if list.CNIVersion != NewestVersion {
			t.Errorf("cniVersion %s: libcni takes %s, want %s", v, list.CNIVersion, NewestVersion)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		delete(m, "cniVersions")
		old, _ := json.Marshal(m)
		if list, err = libcni.ConfListFromBytes(old); err != nil || list.CNIVersion != v {
			t.Errorf("cniVersion %s without cniVersions: %v %v", v, list, err)
		}
	}
}

func mergeHeader(t *testing.T, plug []byte, list *libcni.NetworkConfigList) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(plug, &m); err != nil {
		t.Fatal(err)
	}
	m["name"], m["cniVersion"] = list.Name, list.CNIVersion
	return m
}

func TestWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "net.d")
	path, err := Write(dir, DefaultFile, []byte("one\n"), false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Write(dir, DefaultFile, []byte("two\n"), false); !errors.Is(err, ErrExists) {
		t.Fatalf("second write without force: %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "one\n" {
		t.Fatalf("overwritten without force: %q", b)
	}
	if _, err := Write(dir, DefaultFile, []byte("two\n"), true); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "two\n" {
		t.Fatalf("force did not replace: %q", b)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("mode: %v %v", st, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("left behind: %v", entries)
	}
}

func TestParseMode(t *testing.T) {
	for in, want := range map[string]Mode{"": ModeDirect, "direct": ModeDirect, "vxlan": ModeVXLAN} {
		if m, err := ParseMode(in); err != nil || m != want {
			t.Errorf("ParseMode(%q) = %v, %v", in, m, err)
		}
	}
	if _, err := ParseMode("Direct"); err == nil {
		t.Error("ParseMode is case-sensitive, as the plugin's keys are")
	}
}

// TestKeepChained: the plugins another installer chained after ebpf-cni's
// (istio-cni's way) stay, as they were, after the new ebpf-cni entry;
// nothing is kept of a conflist that is not ebpf-cni's, or not one at all.
func TestKeepChained(t *testing.T) {
	built, err := Build(Options{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}})
	require.NoError(t, err)
	old := []byte(`{"cniVersion":"1.0.0","name":"ebpf-cni","plugins":[{"type":"ebpf-cni","ipam":{"type":"ebpf-ipam"}},{"type":"istio-cni","log_level":"info","kubernetes":{"kubeconfig":"/etc/cni/net.d/ZZZ-istio-cni-kubeconfig"}}]}`)
	got, err := KeepChained(built, old)
	require.NoError(t, err)
	var l struct {
		CNIVersion string                       `json:"cniVersion"`
		Plugins    []map[string]json.RawMessage `json:"plugins"`
	}
	require.NoError(t, json.Unmarshal(got, &l))
	require.Len(t, l.Plugins, 2)
	require.JSONEq(t, `"ebpf-cni"`, string(l.Plugins[0]["type"]))
	require.JSONEq(t, `{"type":"ebpf-ipam","ranges":[[{"subnet":"10.244.1.0/24"}]]}`, string(l.Plugins[0]["ipam"]), "ebpf-cni's entry is the new one")
	require.JSONEq(t, `{"kubeconfig":"/etc/cni/net.d/ZZZ-istio-cni-kubeconfig"}`, string(l.Plugins[1]["kubernetes"]), "the chained plugin as it was")
	require.Equal(t, DefaultVersion, l.CNIVersion)
	again, err := KeepChained(built, got)
	require.NoError(t, err)
	require.Equal(t, got, again, "kept once, not twice")
	for _, other := range []string{`{"plugins":[{"type":"bridge"},{"type":"portmap"}]}`, `not json`, `{"plugins":[{"type":"ebpf-cni"}]}`} {
		same, err := KeepChained(built, []byte(other))
		require.NoError(t, err)
		require.Equal(t, built, same, other)
	}
}
