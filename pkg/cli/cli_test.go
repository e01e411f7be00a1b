package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/buildinfo"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
)

func run(args ...string) (stdout, stderr string, code int) {
	var o, e bytes.Buffer
	code = Main(args, &o, &e)
	return o.String(), e.String(), code
}

func TestMainUsage(t *testing.T) {
	out, _, code := run()
	require.Equal(t, ExitOK, code)
	require.Contains(t, out, "Usage: ebpf-cni <command>")
	for _, name := range commandNames() {
		require.Contains(t, out, "  "+name+" ")
	}

	_, errOut, code := run("natt")
	require.Equal(t, ExitUsage, code)
	require.Contains(t, errOut, `unknown command "natt"`)

	_, errOut, code = run("version", "-o", "xml")
	require.Equal(t, ExitUsage, code)
	require.Contains(t, errOut, "want table or json")
}

// TestEveryCommandDocumented: each command says what it shows, documents
// its JSON, and has the common flags.
func TestEveryCommandDocumented(t *testing.T) {
	require.Subset(t, commandNames(), []string{"counters", "endpoints", "gc", "ipam", "nat", "status", "version"})
	for _, name := range commandNames() {
		out, _, code := run(name, "--help")
		require.Equal(t, ExitOK, code, name)
		require.Contains(t, out, "Usage: ebpf-cni "+name+" [flags]")
		require.Contains(t, out, "JSON:", name)
		for _, f := range []string{"--bpf-root DIR", "--state-dir DIR", "-o table|json"} {
			require.Contains(t, out, f, name)
		}
		require.NotEmpty(t, strings.TrimSpace(commands[name].Summary))
	}
	out, _, _ := run("gc", "--help")
	require.Contains(t, out, "--dry-run")
}

func TestVersionJSON(t *testing.T) {
	out, _, code := run("version", "-o", "json")
	require.Equal(t, ExitOK, code)
	require.Regexp(t, `^\{\n  "version": ".+",\n  "programTag": ".+-[0-9a-f]{12}",\n  "go": ".+",\n  "platform": ".+"\n\}\n$`, out)
}

// TestVersion: the version command, and --version and -version like it,
// print the build's version and the program tag made of it
// ("<version>-<digest>": docs/deploy.md, Releases).
func TestVersion(t *testing.T) {
	require.True(t, strings.HasPrefix(features.Tag(), buildinfo.Version+"-"), features.Tag())
	want := "ebpf-cni " + buildinfo.Version + "\nprograms tag " + features.Tag() + "\n"
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		out, errOut, code := run(args...)
		require.Equal(t, ExitOK, code, errOut)
		require.True(t, strings.HasPrefix(out, want), "%v: %q", args, out)
	}
	out, _, code := run("--version", "-o", "json")
	require.Equal(t, ExitOK, code)
	require.Contains(t, out, `"version": "`+buildinfo.Version+`"`)
}

func TestConflist(t *testing.T) {
	out, errOut, code := run("conflist", "--pod-cidr", "10.244.1.0/24,fd00:10:244:1::/64", "--state-dir", "/run/x")
	require.Equal(t, ExitOK, code, errOut)
	require.Contains(t, out, `"cniVersion": "1.0.0"`)
	require.Contains(t, out, `"stateDir": "/run/x"`)
	require.NotContains(t, out, `"bpfRoot"`)
	require.NotContains(t, out, `"deviceType"`, "left out: the plugin's default, auto")
	require.Contains(t, out, `"subnet": "fd00:10:244:1::/64"`)

	_, errOut, code = run("conflist")
	require.Equal(t, ExitError, code)
	require.Contains(t, errOut, "invalid --pod-cidr: no pod range given")

	_, errOut, code = run("conflist", "--pod-cidr", "10.244.1.0/24", "--mode", "vxlan")
	require.Equal(t, ExitError, code)
	require.Contains(t, errOut, "invalid --cluster-cidrs: mode vxlan needs the cluster's pod ranges")
	_, errOut, code = run("conflist", "--pod-cidr", "10.244.1.0/24", "--vxlan-vni", "7")
	require.Equal(t, ExitError, code)
	require.Contains(t, errOut, "invalid --vxlan-vni: set without mode vxlan")
	out, errOut, code = run("conflist", "--pod-cidr", "10.244.1.0/24", "--cluster-cidrs", "10.244.0.0/16", "--mode", "vxlan", "--vxlan-port", "8472")
	require.Equal(t, ExitOK, code, errOut)
	require.Contains(t, out, `"clusterCIDRs": [`)
	require.Contains(t, out, `"overlay": "vxlan"`)
	require.Contains(t, out, `"vxlanPort": 8472`)
	require.NotContains(t, out, `"vxlanVNI"`)
	require.NotContains(t, out, `"nonMasqueradeCIDRs"`)

	out, errOut, code = run("conflist", "--pod-cidr", "10.244.1.0/24", "--device-type", "veth")
	require.Equal(t, ExitOK, code, errOut)
	require.Contains(t, out, `"deviceType": "veth"`)
	_, errOut, code = run("conflist", "--pod-cidr", "10.244.1.0/24", "--device-type", "tap")
	require.Equal(t, ExitError, code)
	require.Contains(t, errOut, `invalid --device-type: unknown device type "tap" (want auto, netkit or veth)`)
}
