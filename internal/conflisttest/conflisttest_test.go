package conflisttest

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBytes(t *testing.T) {
	b, err := Bytes(Options{BPFRoot: "/b", StateDir: "/s"})
	require.NoError(t, err)
	require.JSONEq(t, `{"cniVersion":"1.1.0","name":"ebpfnet","plugins":[{"type":"ebpf-cni","bpfRoot":"/b","stateDir":"/s",
		"ipam":{"type":"ebpf-ipam","ranges":[[{"subnet":"10.244.1.0/24"}],[{"subnet":"fd00:244:1::/64"}]]}}]}`, string(b))

	b, err = Bytes(Options{Name: "n", Version: "0.4.0", BPFRoot: "/b", StateDir: "/s", AttachMode: "tc", Subnets: []string{"10.9.0.0/16"},
		Capabilities: []string{"mac", "portMappings"}, Keys: map[string]any{"ipMasq": true, "stateDir": "/other"},
		Chained: []map[string]any{{"type": "bandwidth"}}})
	require.NoError(t, err)
	require.JSONEq(t, `{"cniVersion":"0.4.0","name":"n","plugins":[{"type":"ebpf-cni","bpfRoot":"/b","stateDir":"/other","attachMode":"tc",
		"ipMasq":true,"capabilities":{"mac":true,"portMappings":true},
		"ipam":{"type":"ebpf-ipam","ranges":[[{"subnet":"10.9.0.0/16"}]]}},{"type":"bandwidth"}]}`, string(b))

	list := List(t, Options{BPFRoot: "/b", StateDir: "/s", IPAM: map[string]any{"type": "host-local", "subnet": "10.1.0.0/24"}})
	require.Len(t, list.Plugins, 1)
	require.Equal(t, "host-local", list.Plugins[0].Network.IPAM.Type)
}
