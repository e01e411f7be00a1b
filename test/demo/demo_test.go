package main

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// demoBinary builds this command once per test.
func demoBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "demo")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

func demoCmd(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	testutil.RequireRoot(t)
	args = append([]string{"-bin", testutil.PluginDir(t), "-ref", testutil.RefPluginDir(t)}, args...)
	return exec.Command(demoBinary(t), args...)
}

// made is what a demo run says it made: its namespaces, its temporary
// directory (with the private bpffs in it) and its cgroup.
type made struct{ netns, dirs []string }

var (
	netnsLine = regexp.MustCompile(`node netns (\S+), .* world netns (\S+):`)
	bpfRoot   = regexp.MustCompile(`"bpfRoot": "(/[^"]+)/bpffs/ebpf-cni"`)
	cgroupDir = regexp.MustCompile(`"socketCgroupPath": "(/[^"]+)"`)
)

func (m *made) scan(line string) {
	if s := netnsLine.FindStringSubmatch(line); s != nil {
		m.netns = append(m.netns, "/run/netns/"+s[1], "/run/netns/"+s[2])
	}
	for _, re := range []*regexp.Regexp{bpfRoot, cgroupDir} {
		if s := re.FindStringSubmatch(line); s != nil {
			m.dirs = append(m.dirs, s[1])
		}
	}
}

// requireGone: nothing the run made is left, no mount under its directory.
func (m *made) requireGone(t *testing.T) {
	t.Helper()
	require.Len(t, m.netns, 2, "the demo names its node and world namespaces")
	require.Len(t, m.dirs, 2, "the demo names its directory and cgroup")
	for _, p := range append(append([]string{}, m.netns...), m.dirs...) {
		_, err := os.Stat(p)
		require.True(t, errors.Is(err, os.ErrNotExist), "%s is left behind", p)
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	for _, p := range m.dirs {
		require.NotContains(t, string(mounts), " "+p, "a mount under %s is left", p)
	}
}

// TestDemo runs the demo as make demo does and checks that it exits 0,
// that the lines proving masquerade, hostPort and bandwidth are there with
// the figures they claim, and that it removed everything it made.
func TestDemo(t *testing.T) {
	cmd := demoCmd(t)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	t.Logf("demo output:\n%s", out)
	require.NoError(t, err, "demo failed: %s", stderr.String())
	s := string(out)

	for _, want := range []string{
		// masquerade: the world sees the node's addresses, both families
		`world saw 192\.0\.2\.2:\d+`,
		`world saw \[2001:db8:ffff::2\]:\d+`,
		`masquerade ok: the world saw the node's addresses`,
		// hostPort: from the world the pod sees the real client; from the node's localhost
		`hostPort ok: the world -> 192\.0\.2\.2:8080 +pod1 saw 192\.0\.2\.1:\d+`,
		`hostPort ok: the world -> \[2001:db8:ffff::2\]:8080 +pod1 saw \[2001:db8:ffff::1\]:\d+`,
		`hostPort ok: the node  -> 127\.0\.0\.1:8080 +pod1 saw `,
		`hostPort ok: the node  -> \[::1\]:8080 +pod1 saw `,
		// pod to pod through redirect_peer, nothing in FORWARD
		`counter redirect \+\d+; the node's FORWARD chains \(iptables, ip6tables\): 0 packets`,
		`counter drop_spoof_src \+[3-9]`,
		`ADD, median of 5 +\d+ ms +\d+ ms`,
		`\$ ebpf-cni (endpoints|counters|nat|ports|bandwidth|status)\n`,
		`ebpf-cni endpoints afterwards: no endpoints`,
	} {
		require.Regexp(t, want, s)
	}
	for _, c := range []string{"endpoints", "counters", "nat", "ports", "bandwidth", "status"} {
		require.Contains(t, s, "$ ebpf-cni "+c+"\n")
	}
	m := regexp.MustCompile(`bandwidth ok: limit (\d+) Mbit/s, measured ([\d.]+) Mbit/s`).FindStringSubmatch(s)
	require.NotNil(t, m, "no bandwidth line")
	limit, _ := strconv.ParseFloat(m[1], 64)
	got, _ := strconv.ParseFloat(m[2], 64)
	require.InDelta(t, limit, got, limit*0.10, "the measured rate is within 10%% of the limit")

	var mm made
	for _, l := range strings.Split(s, "\n") {
		mm.scan(l)
	}
	mm.requireGone(t)
}

// TestDemoInterrupted: Ctrl-C in the middle of the demo removes what it
// made and exits 130.
func TestDemoInterrupted(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			cmd := demoCmd(t)
			stdout, err := cmd.StdoutPipe()
			require.NoError(t, err)
			require.NoError(t, cmd.Start())
			var m made
			var all strings.Builder
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				all.WriteString(sc.Text() + "\n")
				m.scan(sc.Text())
				if strings.HasPrefix(sc.Text(), "== 3.") { // pods exist, traffic is starting
					require.NoError(t, cmd.Process.Signal(sig))
					break
				}
			}
			done := make(chan error, 1)
			go func() {
				for sc.Scan() {
					all.WriteString(sc.Text() + "\n")
				}
				done <- cmd.Wait()
			}()
			select {
			case err = <-done:
			case <-time.After(60 * time.Second):
				_ = cmd.Process.Kill()
				t.Fatalf("the demo did not exit after %s:\n%s", sig, all.String())
			}
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee, all.String())
			require.Equal(t, 130, ee.ExitCode(), all.String())
			require.Contains(t, all.String(), "removing what the demo made")
			m.requireGone(t)
		})
	}
}

// TestDemoPreflight: on a kernel without what ebpf-cni needs the demo says
// so in one line and exits 1, having made nothing.
func TestDemoPreflight(t *testing.T) {
	cases := []struct {
		name, filesystems string
		btf               bool
		want              string
	}{
		{"no bpffs", "nodev\tsysfs\nnodev\tcgroup2\n", true, "no bpf filesystem"},
		{"no BTF", "nodev\tbpf\nnodev\tcgroup2\n", false, "no BTF"},
		{"no cgroup v2", "nodev\tbpf\nnodev\tcgroup\n", true, "no cgroup v2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			require.NoError(t, os.MkdirAll(filepath.Join(root, "proc"), 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(root, "proc/filesystems"), []byte(c.filesystems), 0o644))
			if c.btf {
				require.NoError(t, os.MkdirAll(filepath.Join(root, "sys/kernel/btf"), 0o755))
				require.NoError(t, os.WriteFile(filepath.Join(root, "sys/kernel/btf/vmlinux"), nil, 0o644))
			}
			cmd := demoCmd(t, "-sysroot", root)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee)
			require.Equal(t, 1, ee.ExitCode())
			require.Empty(t, out, "nothing is shown before the check")
			line := strings.TrimSuffix(stderr.String(), "\n")
			require.NotContains(t, line, "\n", "one line")
			require.Contains(t, line, c.want)
		})
	}
}
