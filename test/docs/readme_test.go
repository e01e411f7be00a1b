// Package docs_test keeps README.md and docs/ true: every shell command in
// README.md runs as written, its conflist installs a working pod, and
// every relative link resolves.
package docs_test

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// block is a fenced code block of a Markdown file.
type block struct{ lang, text string }

func codeBlocks(t *testing.T, md string) []block {
	t.Helper()
	var out []block
	var cur *block
	for _, l := range strings.Split(md, "\n") {
		if strings.HasPrefix(l, "```") {
			if cur == nil {
				cur = &block{lang: strings.TrimPrefix(l, "```")}
			} else {
				out = append(out, *cur)
				cur = nil
			}
			continue
		}
		if cur != nil {
			cur.text += l + "\n"
		}
	}
	require.Nil(t, cur, "an unclosed code block")
	return out
}

func readme(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testutil.ModuleRoot(), "README.md"))
	require.NoError(t, err)
	return string(b)
}

// commands are the shell commands of README.md's sh blocks, comments
// removed, each `a && b` as two, each without sudo.
func commands(t *testing.T, md string) [][]string {
	t.Helper()
	var out [][]string
	for _, b := range codeBlocks(t, md) {
		if b.lang != "sh" {
			continue
		}
		for _, l := range strings.Split(b.text, "\n") {
			l, _, _ = strings.Cut(l, "#")
			for _, c := range strings.Split(l, "&&") {
				f := strings.Fields(c)
				if len(f) > 0 && f[0] == "sudo" {
					f = f[1:]
				}
				if len(f) > 0 {
					out = append(out, f)
				}
			}
		}
	}
	return out
}

// readmeConflist is the JSON block of README.md: the conflist to install.
func readmeConflist(t *testing.T, md string) []byte {
	t.Helper()
	var found []string
	for _, b := range codeBlocks(t, md) {
		if b.lang == "json" {
			found = append(found, b.text)
		}
	}
	require.Len(t, found, 1, "README.md has one JSON block: the conflist")
	return []byte(found[0])
}

// TestReadmeIsAFrontDoor: README.md stays short; the reference is in docs/.
func TestReadmeIsAFrontDoor(t *testing.T) {
	lines := strings.Count(readme(t), "\n")
	t.Logf("README.md: %d lines", lines)
	require.Less(t, lines, 200, "README.md is the front door: put reference text in docs/")
}

// TestReadmeMakeTargets: every make command of README.md names targets
// that exist (make -n fails on an unknown target).
func TestReadmeMakeTargets(t *testing.T) {
	n := 0
	for _, c := range commands(t, readme(t)) {
		if c[0] != "make" {
			continue
		}
		n++
		cmd := exec.Command("make", append([]string{"-n"}, c[1:]...)...)
		cmd.Dir = testutil.ModuleRoot()
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "README.md: %s: %s", strings.Join(c, " "), out)
	}
	require.GreaterOrEqual(t, n, 3, "README.md shows make demo, make test and make install")
}

// TestReadmeKnowsEveryCommand: a command the tests below cannot check
// would go stale unnoticed.
func TestReadmeKnowsEveryCommand(t *testing.T) {
	for _, c := range commands(t, readme(t)) {
		require.Contains(t, []string{"make", "ebpf-cni"}, c[0],
			"README.md runs %q: teach test/docs how to check it, or leave it out", strings.Join(c, " "))
	}
}

// TestReadmeConflist: the conflist README.md installs parses for libcni,
// declares what runtimes need (cniVersion 1.0.0 for containerd 1.6,
// cniVersions with 1.1.0 for containerd 2.x's STATUS, the
// ips capability podman needs next to portMappings and bandwidth), and,
// with bpfRoot, stateDir and socketCgroupPath pointed at the test's own, ADDs a
// working dual-stack pod in a simulated node with every capability a
// runtime passes. Then every ebpf-cni command README.md shows runs, as
// written, in the node against that pod.
func TestReadmeConflist(t *testing.T) {
	md := readme(t)
	raw := readmeConflist(t, md)
	list, err := libcni.ConfListFromBytes(raw)
	require.NoError(t, err, "README.md's conflist does not parse for libcni")
	require.Equal(t, "1.1.0", list.CNIVersion, "libcni v1.2+ (containerd 2.x) takes 1.1.0 from cniVersions")
	var header struct {
		CNIVersion string `json:"cniVersion"`
	}
	require.NoError(t, json.Unmarshal(raw, &header))
	require.Equal(t, "1.0.0", header.CNIVersion, "containerd 1.6 reads cniVersion and cannot take a 1.1.0 result")
	require.Len(t, list.Plugins, 1, "ebpf-cni alone, as the primary plugin")
	require.Equal(t, "ebpf-cni", list.Plugins[0].Network.Type)
	for _, c := range []string{"portMappings", "bandwidth", "ips", "mac"} {
		require.True(t, list.Plugins[0].Network.Capabilities[c], "capability %s", c)
	}

	testutil.RequireRoot(t)
	cg := testutil.Cgroup(t)
	bpfRoot, stateDir := testutil.BPFFS(t), t.TempDir()
	var conf map[string]any
	require.NoError(t, json.Unmarshal(raw, &conf))
	plugin := conf["plugins"].([]any)[0].(map[string]any)
	plugin["bpfRoot"], plugin["stateDir"], plugin["socketCgroupPath"] = bpfRoot, stateDir, cg
	b, err := json.Marshal(conf)
	require.NoError(t, err)
	list, err = libcni.ConfListFromBytes(b)
	require.NoError(t, err)

	node, err := nettest.NewNode()
	require.NoError(t, err)
	t.Cleanup(node.Close)
	bin := testutil.PluginDir(t)
	cni := nettest.NewCNI(node, []string{bin, testutil.RefPluginDir(t)}, t.TempDir())
	ips := []string{"10.244.0.9", "fd00:244::9"}
	const mac = "0e:00:00:00:00:09"
	caps := map[string]any{
		"portMappings": []any{map[string]any{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}},
		"bandwidth":    map[string]any{"egressRate": 20_000_000, "egressBurst": 2_147_483_647},
		"ips":          ips,
		"mac":          mac,
	}
	p, err := cni.AddPod(list, "readme-pod", caps)
	require.NoError(t, err, "ADD with README.md's conflist")
	t.Cleanup(func() { _ = cni.DelPod(list, p) })
	for i, fam := range []int{4, 6} {
		require.Equal(t, ips[i], p.IP(fam).String(), "the ips capability reaches ebpf-ipam")
	}
	require.NoError(t, p.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err == nil {
			require.Equal(t, mac, l.Attrs().HardwareAddr.String(), "the mac capability")
		}
		return err
	}))
	for _, ip := range []net.IP{nettest.WorldIP4, nettest.WorldIP6} {
		out, err := nettest.Ping(p.NS, ip, 2)
		require.NoError(t, err, "the pod reaches the world (masquerade): %s", out)
	}
	require.NoError(t, cni.Check(list, p.RT))

	// What each command must show of the node (a pod that reached the
	// world: its endpoint, counters and masquerade flows), and gc must not
	// collect a live pod.
	want := map[string]func(out string){
		"status":    func(out string) { require.Contains(t, out, "problems: none") },
		"endpoints": func(out string) { require.Contains(t, out, "readme-pod/eth0") },
		"counters":  func(out string) { require.Contains(t, out, "readme-pod/eth0") },
		"nat":       func(out string) { require.Contains(t, out, ips[0]) },
		"gc":        func(out string) { require.NotContains(t, out, "readme-pod") },
		"repair":    func(out string) { require.Contains(t, out, "nothing to mend") },
	}
	var shown []string
	for _, c := range commands(t, md) {
		if c[0] != "ebpf-cni" {
			continue
		}
		shown = append(shown, c[1])
		args := append(append([]string{}, c[1:]...), "--bpf-root", bpfRoot, "--state-dir", stateDir)
		out, err := nettest.Run(node.NS, filepath.Join(bin, "ebpf-cni"), args...)
		require.NoError(t, err, "README.md: %s: %s", strings.Join(c, " "), out)
		check, ok := want[c[1]]
		require.True(t, ok, "README.md shows ebpf-cni %s: say here what it must show", c[1])
		check(out)
	}
	require.Len(t, shown, 6, "the CLI in six lines")
}

var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// pending are pages other changes add; linked ahead of them.
var pending = []string{"docs/deploy.md", "docs/kubernetes.md", "docs/kernels.md", "CONTRIBUTING.md", "docs/development.md"}

// TestDocLinks: every relative link of README.md and docs/*.md names a
// file that exists and, with #anchor, a heading of it.
func TestDocLinks(t *testing.T) {
	root := testutil.ModuleRoot()
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	files = append(files, filepath.Join(root, "README.md"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range mdLink.FindAllStringSubmatch(string(b), -1) {
			link := m[1]
			if strings.Contains(link, "://") {
				continue
			}
			path, anchor, _ := strings.Cut(link, "#")
			target := f
			if path != "" {
				target = filepath.Join(filepath.Dir(f), path)
			}
			rel, _ := filepath.Rel(root, target)
			if _, err := os.Stat(target); err != nil {
				if slicesContains(pending, rel) {
					continue
				}
				t.Errorf("%s links to %s, which does not exist", filepath.Base(f), link)
				continue
			}
			if anchor != "" {
				body, err := os.ReadFile(target)
				require.NoError(t, err)
				if !slicesContains(anchors(string(body)), anchor) {
					t.Errorf("%s links to %s: no heading %q in %s", filepath.Base(f), link, anchor, rel)
				}
			}
		}
	}
}

// anchors are the GitHub anchors of a Markdown file's headings.
func anchors(md string) []string {
	var out []string
	fence := false
	for _, l := range strings.Split(md, "\n") {
		if strings.HasPrefix(l, "```") {
			fence = !fence
		}
		if fence || !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(l, "#")))
		var b strings.Builder
		for _, r := range h {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r > 127:
				b.WriteRune(r)
			}
		}
		out = append(out, b.String())
	}
	return out
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
