// Package testutil provides what the integration tests share: root checks,
// a private bpffs per test, network namespaces, the plugin binaries, and a
// way to call them exactly as a runtime does. Everything it makes is removed
// with t.Cleanup, also when the test fails.
package testutil

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/cgroup"
	"github.com/ebpf-cni/ebpf-cni/pkg/kernel"
)

// RequireRoot skips a test that needs root when not run as root; under CI it
// fails instead, so a misconfigured CI cannot pass by skipping.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("this test needs root, and CI must run as root")
		}
		t.Skip("needs root (run: sudo make test)")
	}
}

// BPFFS mounts a private bpf filesystem for the test and returns a bpfRoot
// inside it. `ip netns exec` remounts /sys, so tests never use /sys/fs/bpf.
func BPFFS(t testing.TB) string {
	t.Helper()
	RequireRoot(t)
	mnt := filepath.Join(t.TempDir(), "bpffs")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	MountBPFFS(t, mnt)
	return filepath.Join(mnt, "ebpf-cni")
}

// MountBPFFS mounts a private bpf filesystem on the existing directory mnt,
// unmounted at cleanup: for a test that starts something on a bpfRoot that
// is no bpffs yet and mounts one under it later.
func MountBPFFS(t testing.TB, mnt string) {
	t.Helper()
	RequireRoot(t)
	if err := unix.Mount("bpf", mnt, "bpf", 0, ""); err != nil {
		t.Fatalf("mounting bpffs at %s: %v", mnt, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
}

// NetNS creates a named network namespace that is removed on cleanup.
func NetNS(t testing.TB) ns.NetNS {
	t.Helper()
	RequireRoot(t)
	n, err := nettest.NewNetNS()
	if err != nil {
		t.Fatalf("creating netns: %v", err)
	}
	t.Cleanup(func() { nettest.CloseNetNS(n) })
	return n
}

// ModuleRoot is the directory holding go.mod.
func ModuleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// Main runs a package's tests, removes what PluginDir built, and fails the
// run when its tests left anything behind: a network namespace, a mount
// (bpffs...), a cgroup, a process (see run.leftovers). Every test package
// that makes any of them uses it: func TestMain(m *testing.M) { testutil.Main(m) }.
func Main(m *testing.M) {
	r, err := startRun()
	if err != nil {
		fmt.Fprintf(os.Stderr, "testutil: preparing the run: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	if err := r.finish(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// PluginDir builds ebpf-cni and ebpf-ipam once per test binary and returns
// the directory holding them, with the upstream loopback plugin (from the
// containernetworking/plugins module go.mod requires: Debian's takes no
// 1.1.0, and chaining tests put it first in a list); Main removes it. Where the tests run without a
// Go toolchain (the make test-kernel guest), EBPF_CNI_TEST_BIN names a
// directory of binaries built beforehand.
func PluginDir(t testing.TB) string {
	t.Helper()
	if dir := os.Getenv("EBPF_CNI_TEST_BIN"); dir != "" {
		return dir
	}
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "ebpf-cni-bin-")
		if buildErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", buildDir+"/", "./cmd/ebpf-cni", "./cmd/ebpf-ipam", UpstreamLoopback)
		cmd.Dir = ModuleRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // static, as make build does
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildDir
}

// Binary builds the package pkg of this module ("./cmd/ebpf-cni-agent")
// static, as make build does, into a directory of the test, named name,
// and returns its path.
func Binary(t testing.TB, pkg, name string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), name)
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Dir = ModuleRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build of %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// UpstreamLoopback is the package of the upstream loopback plugin.
const UpstreamLoopback = "github.com/containernetworking/plugins/plugins/main/loopback"

// VersionDir returns a directory holding ebpf-cni and ebpf-ipam stamped with
// version (a "newer release" of the same tree): built into a temporary
// directory, or, with EBPF_CNI_TEST_VERSIONS set (make test-kernel), taken
// from <that directory>/<version>.
func VersionDir(t testing.TB, version string) string {
	t.Helper()
	if dir := os.Getenv("EBPF_CNI_TEST_VERSIONS"); dir != "" {
		d := filepath.Join(dir, version)
		if _, err := os.Stat(filepath.Join(d, "ebpf-cni")); err != nil {
			t.Fatalf("no prebuilt binaries of version %q: %v (test/kernel/run.sh builds the versions it lists)", version, err)
		}
		return d
	}
	return buildPlugins(t, ModuleRoot(), version)
}

// buildPlugins builds ebpf-cni and ebpf-ipam of the tree at src, stamped
// with version, into a temporary directory.
func buildPlugins(t testing.TB, src, version string) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-ldflags", "-X github.com/ebpf-cni/ebpf-cni/pkg/buildinfo.Version="+version,
		"-o", dir+"/", "./cmd/ebpf-cni", "./cmd/ebpf-ipam")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build of %s: %v\n%s", version, err, out)
	}
	return dir
}

// CommitDir returns a directory holding ebpf-cni and ebpf-ipam as built
// from an earlier commit of this repository (an older release, with its
// own map layouts), stamped with version "commit-<commit>": the commit's
// tree from git, built into a temporary directory. With
// EBPF_CNI_TEST_VERSIONS set it is taken from <that directory>/commit-<commit>
// and the test skips when that has none (test/kernel/run.sh builds
// versions, not commits); so does a checkout without the commit.
func CommitDir(t testing.TB, commit string) string {
	t.Helper()
	version := "commit-" + commit
	if dir := os.Getenv("EBPF_CNI_TEST_VERSIONS"); dir != "" {
		d := filepath.Join(dir, version)
		if _, err := os.Stat(filepath.Join(d, "ebpf-cni")); err != nil {
			t.Skipf("no prebuilt binaries of commit %s: %v", commit, err)
		}
		return d
	}
	src := t.TempDir()
	archive := exec.Command("sh", "-c", `git archive "$1" | tar -x -C "$2"`, "sh", commit, src)
	archive.Dir = ModuleRoot()
	if out, err := archive.CombinedOutput(); err != nil {
		t.Skipf("no tree of commit %s here (git archive): %v\n%s", commit, err, out)
	}
	return buildPlugins(t, src, version)
}

// AttachModes is every attachMode a test runs under; RequireMode skips
// the ones the kernel lacks.
var AttachModes = []string{"tcx", "tc"}

// RequireMode skips a (sub)test of attachMode mode on a kernel without it
// (tcx before 6.6), saying so: such a kernel's ADD refuses the mode with
// code 122 (TestAttachModeTCXMissing), and auto falls back to tc.
func RequireMode(t testing.TB, mode string) {
	t.Helper()
	if mode == "tcx" {
		if f := kernel.HaveTCX(); !f.Available {
			t.Skipf("attachMode tcx: %s", f.Detail)
		}
	}
}

// DefaultMode is the attach mode of a host veth whose configuration names
// none (attach.DefaultMode resolved on this kernel).
func DefaultMode() string {
	if attach.DefaultMode == attach.ModeAuto {
		return BestMode()
	}
	return string(attach.DefaultMode)
}

// PodDevice is the device type the tests' pods get: deviceType auto's
// (netkit where the kernel has it), or EBPF_CNI_TEST_DEVICE_TYPE's
// (internal/conflisttest puts it in every configuration).
func PodDevice() string {
	if d := os.Getenv("EBPF_CNI_TEST_DEVICE_TYPE"); d != "" {
		return d
	}
	if kernel.HaveNetkit().Available {
		return "netkit"
	}
	return "veth"
}

// HookMode is how the hook h of the tests' pods attaches under attachMode
// mode: a netkit hook with a netkit link, whatever the mode.
func HookMode(h attach.Hook, mode string) string {
	if h.Netkit != 0 {
		return string(attach.ModeNetkit)
	}
	return mode
}

// PinnedHooks is how many of hooks attach with a pinned link under
// attachMode mode (tcx and netkit links; a tc filter is not pinned).
func PinnedHooks(hooks []attach.Hook, mode string) int {
	n := 0
	for _, h := range hooks {
		if HookMode(h, mode) != string(attach.ModeTC) {
			n++
		}
	}
	return n
}

// RequireNetkit skips a test of netkit pods on a kernel without netkit.
func RequireNetkit(t testing.TB) {
	t.Helper()
	if f := kernel.HaveNetkit(); !f.Available {
		t.Skipf("netkit pods: %s (make test-kernel KERNEL=linux-image-6.12.113+deb12-amd64-unsigned runs them)", f.Detail)
	}
}

// BestMode is the attachMode auto resolves to on this kernel, for tests
// that need one mode and name it.
func BestMode() string {
	if kernel.HaveTCX().Available {
		return "tcx"
	}
	return "tc"
}

// RequireFQ skips a test of EDT pacing on a kernel without the fq qdisc.
func RequireFQ(t testing.TB) {
	t.Helper()
	if f := kernel.HaveFQ(); !f.Available {
		t.Skipf("EDT needs the fq qdisc: %s (make test-kernel runs this test on Debian 12's 6.1, which has it)", f.Detail)
	}
}

// Emulated: the tests run in the make test-kernel guest, under TCG
// emulation (no KVM): correct, not fast. Its init sets
// EBPF_CNI_TEST_EMULATED.
func Emulated() bool { return os.Getenv("EBPF_CNI_TEST_EMULATED") != "" }

// SkipRateUnderEmulation skips the rest of a test that asserts a rate when
// it runs under emulation, where the guest's CPU, shared with the host's
// load, cannot carry tens of Mbit/s steadily (seen at a host load of 10: 35-47 Mbit/s through
// a 50 Mbit/s tbf, 183 Mbit/s unlimited). What the test did before it
// (traffic, functional checks) stands; the rates are asserted on the host
// kernel, and TestBandwidthEDT asserts per-second accuracy in the guest.
func SkipRateUnderEmulation(t testing.TB, what string) {
	t.Helper()
	if Emulated() {
		t.Skipf("under emulation (make test-kernel, TCG): %s not asserted: the guest cannot carry such rates steadily; asserted on the host kernel", what)
	}
}

// RefPluginDir is where Debian's containernetworking-plugins live.
func RefPluginDir(t testing.TB) string {
	t.Helper()
	for _, d := range []string{"/usr/lib/cni", "/opt/cni/bin"} {
		if _, err := os.Stat(filepath.Join(d, "bridge")); err == nil {
			return d
		}
	}
	t.Fatal("reference CNI plugins not found (make deps installs containernetworking-plugins)")
	return ""
}

// Call is one plugin invocation as a runtime makes it.
type Call struct {
	Command     string // ADD, DEL, CHECK, STATUS, GC, VERSION
	ContainerID string
	NetNS       string
	IfName      string
	Args        string // CNI_ARGS
	Path        string // CNI_PATH
	Env         []string
	Stdin       []byte
}

// Output is what the plugin printed and how it exited.
type Output struct {
	Stdout, Stderr []byte
	ExitCode       int
}

// CNIError is the error object of the spec.
type CNIError struct {
	CNIVersion string `json:"cniVersion"`
	Code       uint   `json:"code"`
	Msg        string `json:"msg"`
	Details    string `json:"details"`
}

// Error decodes stdout as a CNI error; it fails the test if the plugin
// succeeded or printed something else.
func (o *Output) Error(t testing.TB) CNIError {
	t.Helper()
	var e CNIError
	if o.ExitCode == 0 {
		t.Fatalf("plugin succeeded, expected an error; stdout: %s", o.Stdout)
	}
	if err := json.Unmarshal(o.Stdout, &e); err != nil {
		t.Fatalf("stdout is not a CNI error object: %v\n%s", err, o.Stdout)
	}
	return e
}

// Run executes binary with the CNI environment of c. Only the plugin's
// variables are passed, as runtimes do.
func Run(t testing.TB, binary string, c Call) *Output {
	t.Helper()
	cmd := exec.Command(binary)
	env := []string{"PATH=" + os.Getenv("PATH"), runMarker + "=" + os.Getenv(runMarker)}
	add := func(k, v string) {
		if v != "" {
			env = append(env, k+"="+v)
		}
	}
	add("CNI_COMMAND", c.Command)
	add("CNI_CONTAINERID", c.ContainerID)
	add("CNI_NETNS", c.NetNS)
	add("CNI_IFNAME", c.IfName)
	add("CNI_ARGS", c.Args)
	add("CNI_PATH", c.Path)
	cmd.Env = append(env, c.Env...)
	cmd.Stdin = bytes.NewReader(c.Stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	out := &Output{Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}
	if ee, ok := err.(*exec.ExitError); ok {
		out.ExitCode = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running %s: %v", binary, err)
	}
	return out
}

// SpecVersions is every CNI spec version the plugins support; integration
// tests run each case under each.
var SpecVersions = []string{"0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// AtLeast reports whether spec version v is >= min (both from SpecVersions).
func AtLeast(v, min string) bool {
	idx := func(s string) int {
		for i, x := range SpecVersions {
			if x == s {
				return i
			}
		}
		panic("unknown spec version " + s)
	}
	return idx(v) >= idx(min)
}

// Must fails the test with the plugin's output when it did not succeed.
func (o *Output) Must(t testing.TB) *Output {
	t.Helper()
	if o.ExitCode != 0 {
		t.Fatalf("plugin failed (exit %d)\nstdout: %s\nstderr: %s", o.ExitCode, o.Stdout, strings.TrimSpace(string(o.Stderr)))
	}
	return o
}

// AddPod attaches a new pod through c and deletes it at cleanup (DEL is
// idempotent, so a test that already deleted it loses nothing).
func AddPod(t testing.TB, c *nettest.CNI, list *libcni.NetworkConfigList, id string) *nettest.Pod {
	t.Helper()
	return AddPodArgs(t, c, list, id, nil, nil)
}

// AddPodArgs is AddPod with capabilities and CNI_ARGS.
func AddPodArgs(t testing.TB, c *nettest.CNI, list *libcni.NetworkConfigList, id string, caps map[string]any, args [][2]string) *nettest.Pod {
	t.Helper()
	p, err := c.AddPodArgs(list, id, caps, args)
	if err != nil {
		t.Fatalf("ADD %s: %v", id, err)
	}
	t.Cleanup(func() { _ = c.DelPod(list, p) })
	return p
}

// K8sArgs are the CNI_ARGS containerd's CRI passes for a pod (uid may be
// empty: left out).
func K8sArgs(namespace, name, uid string) [][2]string {
	args := [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", namespace}, {"K8S_POD_NAME", name}}
	if uid != "" {
		args = append(args, [2]string{"K8S_POD_UID", uid})
	}
	return args
}

// Cgroup creates a cgroup v2 directory for the test and moves the test
// process into it until cleanup: ebpf-cni's socket hooks (hostPort from
// the node) attach there with cgroupPath, never to the machine's own
// cgroups, and reach the test's sockets only.
func Cgroup(t testing.TB) string {
	t.Helper()
	root, err := cgroup.V2Root()
	if err != nil {
		t.Skipf("no cgroup v2: %v", err)
	}
	dir, err := os.MkdirTemp(root, cgroupPrefix())
	if err != nil {
		t.Fatal(err)
	}
	leave, err := cgroup.Join(dir)
	if err != nil {
		_ = os.Remove(dir)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := leave(); err != nil {
			t.Error(err)
		}
		if err := os.Remove(dir); err != nil {
			t.Errorf("removing %s: %v", dir, err)
		}
	})
	return dir
}
