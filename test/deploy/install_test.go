package deploy_test

import (
	"bytes"
	"context"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

// makeTarget runs a target of the project's Makefile with variables, as an
// operator would, and returns its combined output.
func makeTarget(t *testing.T, target string, vars ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("make", append([]string{"--no-print-directory", "-C", testutil.ModuleRoot(), target}, vars...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// tree lists every path under root (relative, directories with a slash).
func tree(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			rel += "/"
		}
		out = append(out, rel)
		return nil
	})
	require.NoError(t, err)
	sort.Strings(out)
	return out
}

// TestMakeInstall is the Must-hold of the deployment issue on one node:
// make install into a DESTDIR writes both binaries, the reference loopback
// plugin where there is none (a runtime runs it for every pod), and a
// conflist that
// libcni loads and that gives a pod an address from POD_CIDR, with the
// capabilities runtimes need; reinstalling keeps an existing conflist
// unless FORCE=1; make uninstall leaves the DESTDIR as it was, files of
// others included; without POD_CIDR (or with a bad one) nothing is written.
func TestMakeInstall(t *testing.T) {
	testutil.RequireRoot(t)
	dest, bin := t.TempDir(), t.TempDir()
	bpfRoot, stateDir := testutil.BPFFS(t), t.TempDir()
	vars := []string{"DESTDIR=" + dest, "BIN=" + bin, "BPF_ROOT=" + bpfRoot, "STATE_DIR=" + stateDir}

	// What was there before stays, whatever install and uninstall do.
	require.NoError(t, os.MkdirAll(filepath.Join(dest, "opt/cni/bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dest, "opt/cni/bin/bridge"), []byte("another plugin"), 0o755))
	before := tree(t, dest)

	out, err := makeTarget(t, "install", vars...)
	require.Error(t, err, out)
	require.Contains(t, out, "POD_CIDR is required")
	out, err = makeTarget(t, "install", append(vars, "POD_CIDR=10.244.1.7/24")...)
	require.Error(t, err, out)
	require.Contains(t, out, `"10.244.1.7/24" is not a network address (did you mean 10.244.1.0/24?)`)
	require.Equal(t, before, tree(t, dest), "a failed install wrote something")

	out, err = makeTarget(t, "install", append(vars, "POD_CIDR=10.244.1.0/24")...)
	require.NoError(t, err, out)
	require.Equal(t, []string{
		"etc/", "etc/cni/", "etc/cni/net.d/", "etc/cni/net.d/10-ebpf-cni.conflist",
		"opt/", "opt/cni/", "opt/cni/bin/", "opt/cni/bin/.ebpf-cni.installed",
		"opt/cni/bin/bridge", "opt/cni/bin/ebpf-cni", "opt/cni/bin/ebpf-ipam", "opt/cni/bin/loopback",
	}, tree(t, dest))
	require.Contains(t, out, "loopback (the runtime runs it for every pod; there was none)")
	for _, b := range []string{"ebpf-cni", "ebpf-ipam", "loopback"} {
		want, err := os.ReadFile(filepath.Join(bin, b))
		require.NoError(t, err)
		got, err := os.ReadFile(filepath.Join(dest, "opt/cni/bin", b))
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, got), b)
		st, _ := os.Stat(filepath.Join(dest, "opt/cni/bin", b))
		require.Equal(t, fs.FileMode(0o755), st.Mode().Perm())
	}

	confDir := filepath.Join(dest, "etc/cni/net.d")
	list := loadInstalled(t, confDir)
	require.Equal(t, "1.1.0", list.CNIVersion, "libcni v1.2+ takes 1.1.0 from cniVersions (1.0.0 is cniVersion)")
	require.Len(t, list.Plugins, 1)
	require.Equal(t, "ebpf-cni", list.Plugins[0].Network.Type)
	require.Equal(t, map[string]bool{"portMappings": true, "bandwidth": true, "ips": true, "mac": true}, list.Plugins[0].Network.Capabilities,
		"the capabilities README.md's conflist sample lists")
	addPodFrom(t, list, filepath.Join(dest, "opt/cni/bin"), "10.244.1.0/24")

	// Reinstalling keeps the conflist; FORCE=1 replaces it.
	installed, _ := os.ReadFile(filepath.Join(confDir, "10-ebpf-cni.conflist"))
	out, err = makeTarget(t, "install", append(vars, "POD_CIDR=10.244.2.0/24")...)
	require.NoError(t, err, out)
	require.Contains(t, out, "FORCE=1 replaces it")
	again, _ := os.ReadFile(filepath.Join(confDir, "10-ebpf-cni.conflist"))
	require.Equal(t, string(installed), string(again))
	out, err = makeTarget(t, "install", append(vars, "POD_CIDR=10.244.2.0/24,fd00:10:244:2::/64", "FORCE=1")...)
	require.NoError(t, err, out)
	require.Contains(t, out, "wrote ")
	list = loadInstalled(t, confDir)
	addPodFrom(t, list, filepath.Join(dest, "opt/cni/bin"), "10.244.2.0/24", "fd00:10:244:2::/64")

	// Someone else's conflist next to ours is not ours to remove.
	require.NoError(t, os.WriteFile(filepath.Join(confDir, "99-other.conflist"), []byte("{}"), 0o644))
	out, err = makeTarget(t, "uninstall", vars...)
	require.NoError(t, err, out)
	require.ElementsMatch(t, append(append([]string{}, before...), "etc/", "etc/cni/", "etc/cni/net.d/", "etc/cni/net.d/99-other.conflist"), tree(t, dest))
	require.NoError(t, os.RemoveAll(filepath.Join(dest, "etc")))
	require.Equal(t, before, tree(t, dest))

	// A second uninstall finds nothing to do.
	out, err = makeTarget(t, "uninstall", vars...)
	require.NoError(t, err, out)
	require.Contains(t, out, "nothing was installed here")

	// A loopback that was there (the distribution's) is kept, and stays.
	theirs := filepath.Join(dest, "opt/cni/bin/loopback")
	require.NoError(t, os.WriteFile(theirs, []byte("the node's loopback"), 0o755))
	out, err = makeTarget(t, "install", append(vars, "POD_CIDR=10.244.1.0/24")...)
	require.NoError(t, err, out)
	require.Contains(t, out, "kept the existing "+theirs)
	out, err = makeTarget(t, "uninstall", vars...)
	require.NoError(t, err, out)
	got, err := os.ReadFile(theirs)
	require.NoError(t, err)
	require.Equal(t, "the node's loopback", string(got))
}

// TestMakeInstallIntoNewDestdir: a DESTDIR that does not exist yet (a
// packaging staging root) is made, the install is complete there, and
// uninstall removes what install wrote. Bounded, so a loop in the script
// fails the test instead of hanging it.
func TestMakeInstallIntoNewDestdir(t *testing.T) {
	testutil.RequireRoot(t)
	dest, bin := filepath.Join(t.TempDir(), "stage", "root"), t.TempDir()
	bpfRoot, stateDir := testutil.BPFFS(t), t.TempDir()
	vars := []string{"DESTDIR=" + dest, "BIN=" + bin, "BPF_ROOT=" + bpfRoot, "STATE_DIR=" + stateDir, "POD_CIDR=10.244.3.0/24"}
	run := func(target string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "make", append([]string{"--no-print-directory", "-C", testutil.ModuleRoot(), target}, vars...)...)
		out, err := cmd.CombinedOutput()
		require.NoError(t, ctx.Err(), "make %s did not return: %s", target, out)
		require.NoError(t, err, "make %s: %s", target, out)
		return string(out)
	}
	run("install")
	require.Equal(t, []string{
		"etc/", "etc/cni/", "etc/cni/net.d/", "etc/cni/net.d/10-ebpf-cni.conflist",
		"opt/", "opt/cni/", "opt/cni/bin/", "opt/cni/bin/.ebpf-cni.installed",
		"opt/cni/bin/ebpf-cni", "opt/cni/bin/ebpf-ipam", "opt/cni/bin/loopback", // the bin dir had none
	}, tree(t, dest))
	list := loadInstalled(t, filepath.Join(dest, "etc/cni/net.d"))
	require.True(t, list.Plugins[0].Network.Capabilities["mac"])
	run("uninstall")
	require.Empty(t, tree(t, dest), "uninstall removes all that install wrote; the staging root stays, empty")
}

// loadInstalled loads the network from confDir the way runtimes do: the
// first configuration file in it, by libcni.
func loadInstalled(t *testing.T, confDir string) *libcni.NetworkConfigList {
	t.Helper()
	files, err := libcni.ConfFiles(confDir, []string{".conf", ".conflist", ".json"})
	require.NoError(t, err)
	require.NotEmpty(t, files)
	list, err := libcni.ConfListFromFile(files[0])
	require.NoError(t, err)
	return list
}

// addPodFrom attaches a pod through the installed plugins on a simulated
// node, checks its addresses lie in the ranges, and detaches it.
func addPodFrom(t *testing.T, list *libcni.NetworkConfigList, binDir string, ranges ...string) {
	t.Helper()
	node, err := nettest.NewNode()
	require.NoError(t, err)
	t.Cleanup(node.Close)
	c := nettest.NewCNI(node, []string{binDir}, t.TempDir())
	pod := testutil.AddPod(t, c, list, "install-test")
	require.Len(t, pod.Result.IPs, len(ranges))
	for i, r := range ranges {
		_, n, _ := net.ParseCIDR(r)
		require.True(t, n.Contains(pod.Result.IPs[i].Address.IP), "%s not in %s", pod.Result.IPs[i].Address.IP, r)
	}
	_, err = nettest.Ping(node.NS, pod.IP(4), 2)
	require.NoError(t, err, "the node reaches its pod")
	require.NoError(t, c.Check(list, pod.RT))
	require.NoError(t, c.DelPod(list, pod))
}
