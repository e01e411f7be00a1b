package agent

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/buildinfo"
)

func runMain(args ...string) (string, string, int) {
	var o, e bytes.Buffer
	code := Main(args, &o, &e)
	return o.String(), e.String(), code
}

// TestVersion: version, --version and -version print the build's version,
// the same as ebpf-cni's (docs/deploy.md, Releases).
func TestVersion(t *testing.T) {
	for _, arg := range []string{"version", "--version", "-version"} {
		out, errOut, code := runMain(arg)
		require.Equal(t, 0, code, errOut)
		require.Equal(t, "ebpf-cni-agent "+buildinfo.Version+"\n", out, arg)
	}
}

// TestMainErrors: every bad setting is refused before the agent talks to
// the API server, naming the flag or variable.
func TestMainErrors(t *testing.T) {
	out, _, code := runMain("version")
	require.Equal(t, 0, code)
	require.Contains(t, out, "ebpf-cni-agent ")

	_, errOut, code := runMain()
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "Usage:")
	_, errOut, code = runMain("start")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `unknown command "start"`)

	t.Setenv(EnvNodeName, "n1")
	t.Setenv(EnvMode, "vxlan")
	_, errOut, code = runMain("install")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "invalid clusterCIDRs: mode vxlan needs the cluster's pod ranges")
	// The tunnel endpoints are opened before the API server is asked (and
	// capabilities are kept: this is the test's process); a bpfRoot that
	// is no bpffs yet stops nothing: the agent says so and goes on (to the
	// API server, here none configured).
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	_, errOut, code = runMain("run", "-drop-caps=false", "-bpf-root", t.TempDir(), "-state-dir", t.TempDir())
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "tunnel endpoints cannot be written until the plugin's bpfRoot is on a bpffs: retrying")
	require.Contains(t, errOut, "not on a bpf filesystem")
	require.Contains(t, errOut, "outside a pod, give -kubeconfig")
	t.Setenv(EnvClusterCIDRs, "10.244.0.0/16")
	t.Setenv(EnvVXLANPort, "udp")
	_, errOut, code = runMain("install")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `EBPF_CNI_VXLAN_PORT: "udp" is not a number`)
	t.Setenv(EnvVXLANPort, "")
	t.Setenv(EnvVXLANVNI, "16777216")
	_, errOut, code = runMain("install")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "invalid vxlanVNI: 16777216 is outside 1..16777215")
	t.Setenv(EnvVXLANVNI, "")
	t.Setenv(EnvClusterCIDRs, "")
	t.Setenv(EnvMode, "bgp")
	_, errOut, code = runMain("run")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `"bgp" is not a mode`)
	t.Setenv(EnvMode, "direct")

	t.Setenv(EnvMasquerade, "yes")
	_, errOut, code = runMain("install")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `EBPF_CNI_MASQUERADE: "yes" is not true or false`)
	t.Setenv(EnvMasquerade, "false")

	t.Setenv(EnvNetPolicy, "on")
	_, errOut, code = runMain("run")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `EBPF_CNI_NETWORK_POLICY: "on" is not true or false`)
	t.Setenv(EnvNetPolicy, "")

	t.Setenv(EnvXlat, "yes")
	_, errOut, code = runMain("run")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `EBPF_CNI_TRANSLATED_DESTINATIONS: "yes" is not true or false`)
	t.Setenv(EnvXlat, "")
	_, errOut, code = runMain("run", "-service-cidrs", "10.96.0.0/12,10.96.0.1/33")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `-service-cidrs: "10.96.0.1/33"`)

	t.Setenv(EnvClusterCIDRs, "10.244.0.0/33")
	_, errOut, code = runMain("install")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `invalid clusterCIDRs: "10.244.0.0/33" is not a CIDR`)
	t.Setenv(EnvClusterCIDRs, "10.244.0.0/16")

	t.Setenv(EnvServiceCIDRs, "10.244.0.0/20")
	_, errOut, code = runMain("install")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "invalid serviceCIDRs: 10.244.0.0/20 overlaps")
	t.Setenv(EnvServiceCIDRs, "10.96.0.0/12")

	t.Setenv(EnvMTU, "big")
	_, errOut, code = runMain("install")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `EBPF_CNI_MTU: "big" is not a number`)
	t.Setenv(EnvMTU, "")

	t.Setenv(EnvDeviceType, "vet")
	_, errOut, code = runMain("install")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `EBPF_CNI_DEVICE_TYPE: unknown device type "vet" (want auto, netkit or veth)`)
	_, errOut, code = runMain("install", "-device-type", "Netkit")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `-device-type: unknown device type "Netkit"`)
	// netkit is the plugin's to refuse on a kernel without it, at ADD.
	t.Setenv(EnvDeviceType, "netkit")

	// All good: the next step needs an API server, and outside a pod there
	// is none configured.
	_, errOut, code = runMain("install")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "outside a pod, give -kubeconfig")
	t.Setenv(EnvDeviceType, "")

	t.Setenv(EnvNodeName, "")
	_, errOut, code = runMain("install", "-kubeconfig", "/nonexistent")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "no node name: set NODE_NAME")
}

// TestUninstallFlags: uninstall refuses, changing nothing, a bpfRoot or
// stateDir that is not a directory of ebpf-cni's own (a slip that would
// empty the whole bpffs or /run) and a route protocol of the kernel's;
// pause takes no argument and returns once told to stop.
func TestUninstallFlags(t *testing.T) {
	for args, want := range map[string]string{
		"-state-dir /run":           "stateDir /run: not a directory of ebpf-cni's own, refusing to empty it",
		"-state-dir /var/run/":      "stateDir /var/run/: not a directory of ebpf-cni's own",
		"-bpf-root /sys/fs/bpf":     "bpfRoot /sys/fs/bpf: not a directory of ebpf-cni's own",
		"-bpf-root-mount /":         "bpfRoot /: not a directory of ebpf-cni's own",
		"-state-dir run/ebpf-cni":   "stateDir run/ebpf-cni: want an absolute path",
		"-route-protocol 4":         "route protocol 4: want 5..255",
		"-cni-bin-dir /tmp/x extra": `unexpected argument "extra"`,
	} {
		_, errOut, code := runMain(append([]string{"uninstall"}, strings.Fields(args)...)...)
		require.Equal(t, 2, code, "%s: %s", args, errOut)
		require.Contains(t, errOut, want, args)
	}
	_, errOut, code := runMain("pause", "now")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `unexpected argument "now"`)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, pauseCmd(ctx, nil, io.Discard, slog.New(slog.NewTextHandler(io.Discard, nil))))
}
