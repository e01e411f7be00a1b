package cli_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/cli"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/kernel"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// TestEndpointsAndStatus: after three pods are added, endpoints lists the
// three with their IPs, MAC, host veth and the program attached in the
// configured mode; status names that attach mode and finds no problem.
func TestEndpointsAndStatus(t *testing.T) {
	for _, mode := range testutil.AttachModes {
		t.Run(mode, func(t *testing.T) {
			testutil.RequireMode(t, mode)
			e := newEnv(t)
			list := e.confList(mode)
			pods := map[string]*nettest.Pod{}
			for i := range 3 {
				id := fmt.Sprintf("pod-%d", i)
				pods[id] = e.addPod(list, id)
			}

			hooks := endpoint.HooksFor(testutil.PodDevice())
			modes := map[string]int{}
			for _, h := range hooks {
				modes[testutil.HookMode(h, mode)] += 3
			}
			eps := e.endpoints()
			require.Len(t, eps, 3)
			for _, ep := range eps {
				p := pods[ep.ContainerID]
				require.NotNil(t, p, "unexpected endpoint %s", ep.ContainerID)
				require.ElementsMatch(t, []string{p.IP(4).String(), p.IP(6).String()}, ep.IPs)
				require.Equal(t, "eth0", ep.IfName)
				require.Equal(t, "clinet", ep.Network)
				require.Equal(t, p.Result.Interfaces[0].Name, ep.HostVeth)
				if testutil.PodDevice() == "netkit" {
					require.Equal(t, "00:00:00:00:00:00", ep.MAC, "a netkit pod (L3 mode) has no MAC")
				} else {
					require.Equal(t, p.Result.Interfaces[1].Mac, ep.MAC)
				}
				require.True(t, ep.Recorded && ep.InMaps && ep.VethPresent)
				require.Empty(t, ep.Problems)
				require.Len(t, ep.Attachments, len(hooks))
				for i, a := range ep.Attachments {
					require.Equal(t, hooks[i].Name, a.Hook)
					require.Equal(t, testutil.HookMode(hooks[i], mode), a.Mode)
					require.Equal(t, testutil.HookMode(hooks[i], mode), a.RecordedMode)
					require.Len(t, a.ProgramIDs, 1)
					require.NotEmpty(t, a.ProgramTag)
				}
			}

			// The table: one row per pod, columns aligned under the header.
			r := e.cli("endpoints")
			require.Equal(t, cli.ExitOK, r.code, "%s", r)
			lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
			require.Len(t, lines, 4, r.stdout)
			col := strings.Index(lines[0], "HOST VETH")
			for _, ep := range eps {
				row := rowOf(t, lines, ep.HostVeth)
				require.Equal(t, col, strings.Index(row, ep.HostVeth), "host veth column misaligned:\n%s", r.stdout)
				require.Contains(t, row, ep.IPs[0])
				require.Contains(t, row, hooks[0].Name+" "+testutil.HookMode(hooks[0], mode))
				require.True(t, strings.HasSuffix(row, "ok"), row)
			}

			var st cli.Status
			e.json(&st, cli.ExitOK, "status")
			require.Equal(t, modes, st.AttachModes, "one attachment per hook per pod")
			require.Equal(t, map[string]int{testutil.PodDevice(): 3}, st.Devices)
			require.Equal(t, 3, st.Endpoints)
			require.Empty(t, st.Problems)
			for _, f := range []string{"bpffs", "btf"} {
				require.True(t, st.Features[f].Available, "%s: %s", f, st.Features[f].Detail)
			}
			// Every kernel feature, as found (make test-kernel runs this on
			// a kernel without tcx and with fq, this machine the reverse).
			for name, f := range kernel.Probe() {
				require.Equal(t, f, st.Features[name], "status reports %s", name)
			}
			require.Len(t, st.Programs, 1)
			require.True(t, st.Programs[0].Current)
			attached := map[string]int{}
			for _, p := range st.Programs[0].Programs {
				attached[p.Name] = p.Endpoints
			}
			require.Equal(t, 3, attached[hooks[0].Name], "%v", attached)

			r = e.cli("status")
			require.Equal(t, cli.ExitOK, r.code, "%s", r)
			modeRow := rowOf(t, strings.Split(r.stdout, "\n"), "ATTACH MODE")
			require.NotEmpty(t, modeRow)
			for m, n := range modes {
				require.Regexp(t, fmt.Sprintf(`(?m)^%s\s+%d$`, m, n), r.stdout)
			}
			require.Contains(t, r.stdout, "problems: none")
			// The human table lists every feature the JSON holds.
			for name, f := range st.Features {
				require.Regexp(t, fmt.Sprintf(`(?m)^%s\s+%s\b`, name, map[bool]string{true: "yes", false: "no"}[f.Available]), r.stdout, "status table row %s", name)
			}
		})
	}
}

// rowOf is the first line containing s.
func rowOf(t *testing.T, lines []string, s string) string {
	t.Helper()
	for _, l := range lines {
		if strings.Contains(l, s) {
			return l
		}
	}
	t.Fatalf("no line with %q in:\n%s", s, strings.Join(lines, "\n"))
	return ""
}

// TestEndpointsPod: a pod added with containerd's CNI_ARGS is shown by its
// namespace/name (table) and namespace, name, uid (JSON); one added without
// them has none.
func TestEndpointsPod(t *testing.T) {
	e := newEnv(t)
	list := e.confList(testutil.BestMode())
	n, err := nettest.NewNetNS()
	require.NoError(t, err)
	t.Cleanup(func() { nettest.CloseNetNS(n) })
	rt := &libcni.RuntimeConf{ContainerID: "k8s-pod", NetNS: n.Path(), IfName: "eth0", Args: [][2]string{
		{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "shop"}, {"K8S_POD_NAME", "web-0"}, {"K8S_POD_UID", "8d1c6b7e-0c1f-4b8e-9d52-2f7f3c1a9e01"}}}
	_, err = e.cni.Add(list, rt)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.cni.Del(list, rt) })
	e.addPod(list, "plain")

	got := map[string]*node.Pod{}
	for _, ep := range e.endpoints() {
		got[ep.ContainerID] = ep.Pod
	}
	require.Equal(t, map[string]*node.Pod{"k8s-pod": {Namespace: "shop", Name: "web-0", UID: "8d1c6b7e-0c1f-4b8e-9d52-2f7f3c1a9e01"}, "plain": nil}, got)
	r := e.cli("endpoints")
	require.Equal(t, cli.ExitOK, r.code, "%s", r)
	lines := strings.Split(r.stdout, "\n")
	require.Contains(t, lines[0], "POD")
	require.Contains(t, rowOf(t, lines, "k8s-pod"), " shop/web-0 ")
}
