package datapath_test

import (
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
)

// ebpf-cni with ebpf-ipam under the CNI_ARGS real runtimes send (their
// sources: containerd's CRI getPodCNILabels, podman's libnetwork/cni
// getRuntimeConfig, cnitool's parseArgs): every call works, MAC= (ebpf-cni)
// and IP= (ebpf-ipam) are honoured; a key nobody knows, without
// IgnoreUnknown, is ebpf-ipam's code 4 naming it, and nothing is left.
// The pod's K8S_POD_* identity is in endpoint_pods (what the CLI and the
// agent's metrics name a pod by) from ADD to DEL.
func TestCNIArgsOfRealRuntimes(t *testing.T) {
	const mac, ip = "0a:58:0a:f4:01:09", "10.244.1.9"
	cases := []struct {
		runtime      string
		args         [][2]string
		wantMAC, wIP string
		pod          *endpoint.Pod
	}{
		{"containerd", [][2]string{{"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", "web-0"},
			{"K8S_POD_INFRA_CONTAINER_ID", "args-pod"}, {"K8S_POD_UID", "0b6f2a4c-6d1e-4f4a-9c33-5a7f1e2d3c4b"}, {"IgnoreUnknown", "1"}}, "", "",
			&endpoint.Pod{Namespace: "default", Name: "web-0", UID: "0b6f2a4c-6d1e-4f4a-9c33-5a7f1e2d3c4b"}},
		{"podman --ip --mac-address", [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAME", "web"}, {"MAC", mac}, {"IP", ip}}, mac, ip,
			&endpoint.Pod{Name: "web"}},
		{"cnitool MAC", [][2]string{{"MAC", mac}}, mac, "", nil},
		{"cnitool IP", [][2]string{{"IP", ip}}, "", ip, nil},
	}
	for _, ver := range testutil.SpecVersions {
		t.Run(ver, func(t *testing.T) {
			e := newEnv(t)
			list := e.confList(netOpts{version: ver})
			for _, c := range cases {
				n, err := nettest.NewNetNS()
				require.NoError(t, err)
				t.Cleanup(func() { nettest.CloseNetNS(n) })
				rt := &libcni.RuntimeConf{ContainerID: "args-pod", NetNS: n.Path(), IfName: "eth0", Args: c.args}
				res, err := e.cni.Add(list, rt)
				require.NoError(t, err, c.runtime)
				p := &nettest.Pod{NS: n, RT: rt, Result: res}
				if c.wIP != "" {
					require.Equal(t, c.wIP, p.IP(4).String(), c.runtime)
				}
				require.NoError(t, n.Do(func(ns.NetNS) error {
					l, err := netlink.LinkByName("eth0")
					if err == nil && c.wantMAC != "" {
						require.Equal(t, c.wantMAC, l.Attrs().HardwareAddr.String(), c.runtime)
					}
					return err
				}))
				out, err := nettest.Ping(n, nettest.NodeIP4, 1)
				require.NoError(t, err, "%s: %s", c.runtime, out)
				want := map[uint32]endpoint.Pod{}
				if c.pod != nil {
					want[uint32(e.hostIndex(p))] = *c.pod
				}
				require.Equal(t, want, e.podEntries(), c.runtime)
				require.NoError(t, e.cni.DelPod(list, p), c.runtime)
				require.Empty(t, e.podEntries(), "%s: endpoint_pods entry left after DEL", c.runtime)
			}

			n, err := nettest.NewNetNS()
			require.NoError(t, err)
			t.Cleanup(func() { nettest.CloseNetNS(n) })
			_, err = e.cni.Add(list, &libcni.RuntimeConf{ContainerID: "typo", NetNS: n.Path(), IfName: "eth0",
				Args: [][2]string{{"IP", ip}, {"K8S_POD_NAME", "web"}}})
			require.Equal(t, uint(types.ErrInvalidEnvironmentVariables), cniCode(t, err))
			require.Contains(t, err.Error(), `"K8S_POD_NAME=web"`)
			e.requireClean()
			require.Empty(t, e.ipamOwners())
		})
	}
}
