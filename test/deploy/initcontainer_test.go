package deploy_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/conflist"
)

// TestInstallFromNode is the DaemonSet's init container: it copies the
// plugins (and loopback, which the node lacks), waits (writing no conflist, so the runtime keeps the node not
// ready) while the Node has no spec.podCIDRs, then writes the conflist for
// them and runs the plugin's STATUS, which loads the programs. The conflist
// it wrote gives a pod an address from the Node's range on a simulated node.
// It records what it wrote (agent.InstallRecord), and a second run keeps
// the record, adding nothing for a loopback that is the node's. A ConfigMap asking for vxlan without the cluster's ranges fails at once
// and writes nothing.
func TestInstallFromNode(t *testing.T) {
	testutil.RequireRoot(t)
	bin, conf := t.TempDir(), t.TempDir()
	bpfRoot := testutil.BPFFS(t)
	n := (&simNode{name: "node-a", ip4: net.ParseIP("192.0.2.2"), ip6: net.ParseIP("2001:db8:ffff::2"), podCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.5.0/24")}}).object()
	n.Spec.PodCIDRs, n.Spec.PodCIDR = nil, "" // kubelet registered it; the IPAM controller has not got to it
	client := fake.NewClientset()
	_, err := client.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{})
	require.NoError(t, err)

	cfg := agent.InstallConfig{
		NodeName: "node-a", SrcDir: testutil.PluginDir(t), CNIBinDir: bin, CNIConfDir: conf,
		Conf:   conflist.Options{Masquerade: true, BPFRoot: bpfRoot, StateDir: t.TempDir()},
		WarmUp: true, PollEvery: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	bad := cfg
	bad.Conf.Mode = conflist.ModeVXLAN
	require.ErrorContains(t, agent.Install(context.Background(), client, bad), "invalid clusterCIDRs: mode vxlan needs the cluster's pod ranges")
	entries, _ := os.ReadDir(bin)
	require.Empty(t, entries, "a refused install wrote plugins")

	done := make(chan error, 1)
	go func() { done <- agent.Install(context.Background(), client, cfg) }()
	require.Eventually(t, func() bool { _, err := os.Stat(filepath.Join(bin, "ebpf-ipam")); return err == nil }, 10*time.Second, 10*time.Millisecond)
	time.Sleep(100 * time.Millisecond) // several polls of a Node without a range
	entries, _ = os.ReadDir(conf)
	require.Empty(t, entries, "a conflist was written before the node had a range")
	select {
	case err := <-done:
		t.Fatalf("install returned before the node had a range: %v", err)
	default:
	}

	n.Spec.PodCIDRs = []string{"10.244.5.0/24", "fd00:10:244:5::/64"}
	n.Spec.PodCIDR = n.Spec.PodCIDRs[0]
	_, err = client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
	require.NoError(t, err)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("install did not finish after the node got its range")
	}
	for _, b := range append(agent.Plugins, agent.Loopback) { // the node had no loopback
		want, _ := os.ReadFile(filepath.Join(cfg.SrcDir, b))
		got, err := os.ReadFile(filepath.Join(bin, b))
		require.NoError(t, err)
		require.Equal(t, want, got, b)
	}
	// The record of what it wrote, for uninstall: loopback with the
	// content it put there.
	image, err := os.ReadFile(filepath.Join(cfg.SrcDir, agent.Loopback))
	require.NoError(t, err)
	record, err := os.ReadFile(filepath.Join(bin, agent.InstallRecord))
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("# ebpf-cni-agent install: the files it wrote on this node; ebpf-cni-agent uninstall removes them\n"+
		"bin ebpf-cni\nbin ebpf-ipam\nbin loopback sha256=%x\nconf %s\n", sha256.Sum256(image), conflist.DefaultFile), string(record))
	programs, err := os.ReadDir(filepath.Join(bpfRoot, "programs"))
	require.NoError(t, err, "STATUS loaded no programs")
	require.NotEmpty(t, programs)

	list := loadInstalled(t, conf)
	require.Equal(t, conflist.DefaultName, list.Name)
	require.Equal(t, conflist.NewestVersion, list.CNIVersion, "libcni v1.2+ takes 1.1.0 from cniVersions")
	var header struct {
		CNIVersion  string   `json:"cniVersion"`
		CNIVersions []string `json:"cniVersions"`
	}
	require.NoError(t, json.Unmarshal(list.Bytes, &header))
	require.Equal(t, conflist.DefaultVersion, header.CNIVersion, "what libcni v1.1 and older read")
	require.Equal(t, []string{conflist.DefaultVersion, conflist.NewestVersion}, header.CNIVersions)
	addPodFrom(t, list, bin, "10.244.5.0/24", "fd00:10:244:5::/64")

	// Run again (a restarted DaemonSet pod): same files, nothing else. A
	// loopback the node has (its distribution's) is never replaced, nor
	// another plugin's conflist, named before or after ebpf-cni's; what
	// another installer chained after ebpf-cni in its conflist (istio-cni's
	// way) stays chained.
	theirs := filepath.Join(bin, agent.Loopback)
	require.NoError(t, os.WriteFile(theirs, []byte("the node's loopback"), 0o755))
	foreign := map[string][]byte{
		"05-multus.conf":           []byte(`{"cniVersion":"1.0.0","name":"multus","type":"multus"}` + "\n"),
		"99-other.conflist":        []byte(`{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"bridge"}]}` + "\n"),
		"ZZZ-istio-cni.kubeconfig": []byte("apiVersion: v1\n"),
	}
	for name, b := range foreign {
		require.NoError(t, os.WriteFile(filepath.Join(conf, name), b, 0o600))
	}
	path := filepath.Join(conf, conflist.DefaultFile)
	chained := appendPlugin(t, path, `{"type":"istio-cni","log_level":"info"}`)
	require.NoError(t, agent.Install(context.Background(), client, cfg))
	entries, _ = os.ReadDir(conf)
	require.Len(t, entries, 1+len(foreign))
	for name, b := range foreign {
		got, err := os.ReadFile(filepath.Join(conf, name))
		require.NoError(t, err)
		require.Equal(t, b, got, "%s changed", name)
	}
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, chained, after, "the chained plugin stays, after ebpf-cni's")
	var types struct {
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	require.NoError(t, json.Unmarshal(after, &types))
	require.Len(t, types.Plugins, 2)
	require.Equal(t, "ebpf-cni", types.Plugins[0].Type)
	require.Equal(t, "istio-cni", types.Plugins[1].Type)
	entries, _ = os.ReadDir(bin)
	require.Len(t, entries, 4)
	got, err := os.ReadFile(theirs)
	require.NoError(t, err)
	require.Equal(t, "the node's loopback", string(got))
	again, err := os.ReadFile(filepath.Join(bin, agent.InstallRecord))
	require.NoError(t, err)
	require.Equal(t, string(record), string(again), "the node's loopback is not recorded; what the record had stays")
}

// appendPlugin chains plugin (JSON) after the plugins of the conflist at
// path, as another installer would, and returns the file's content.
func appendPlugin(t *testing.T, path, plugin string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var l map[string]any
	require.NoError(t, json.Unmarshal(b, &l))
	var p any
	require.NoError(t, json.Unmarshal([]byte(plugin), &p))
	l["plugins"] = append(l["plugins"].([]any), p)
	out, err := json.MarshalIndent(l, "", "  ")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, out, 0o644))
	// What ebpf-cni's install writes of it (the same configuration):
	// its own entry, then the chained one, in its order and indentation.
	built, err := conflist.KeepChained(b, out)
	require.NoError(t, err)
	return built
}

// TestInstallStatusFails: the init container writes the conflist only
// after the plugin's STATUS passed. On a node where STATUS fails (here no
// bpffs at the plugin's bpfRoot), a first install writes none, and a later
// one (a restarted or upgraded DaemonSet pod: the plugins are replaced
// already) removes the one an earlier run wrote, so that no runtime
// reports the network ready with a plugin that cannot load. Once STATUS
// passes again, the conflist is back.
func TestInstallStatusFails(t *testing.T) {
	testutil.RequireRoot(t)
	n := (&simNode{name: "node-a", ip4: net.ParseIP("192.0.2.2"), ip6: net.ParseIP("2001:db8:ffff::2"),
		podCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.5.0/24")}}).object()
	client := fake.NewClientset()
	_, err := client.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{})
	require.NoError(t, err)
	bin, conf := t.TempDir(), t.TempDir()
	good := agent.InstallConfig{
		NodeName: "node-a", SrcDir: testutil.PluginDir(t), CNIBinDir: bin, CNIConfDir: conf,
		Conf:   conflist.Options{Masquerade: true, BPFRoot: testutil.BPFFS(t), StateDir: t.TempDir()},
		WarmUp: true, PollEvery: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	broken := good
	broken.Conf.BPFRoot = filepath.Join(t.TempDir(), "not-bpffs")
	require.NoError(t, os.Mkdir(broken.Conf.BPFRoot, 0o755))
	conflists := func() []string {
		entries, err := os.ReadDir(conf)
		require.NoError(t, err)
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return names
	}

	err = agent.Install(context.Background(), client, broken)
	require.ErrorContains(t, err, "the plugin's STATUS failed")
	require.ErrorContains(t, err, "no conflist written")
	require.Empty(t, conflists(), "a conflist was written although STATUS failed")

	require.NoError(t, agent.Install(context.Background(), client, good))
	require.Equal(t, []string{conflist.DefaultFile}, conflists())

	err = agent.Install(context.Background(), client, broken)
	require.ErrorContains(t, err, "the plugin's STATUS failed")
	require.ErrorContains(t, err, "removed "+filepath.Join(conf, conflist.DefaultFile))
	require.Empty(t, conflists(), "the earlier conflist stayed although STATUS fails now")

	require.NoError(t, agent.Install(context.Background(), client, good))
	require.Equal(t, []string{conflist.DefaultFile}, conflists())
}
