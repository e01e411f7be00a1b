package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
)

// Pod ranges of the two networks (10.x and fd00::/8 only, per the tests'
// network rules).
const (
	podNet4 = "10.244.0.0/24"
	podNet6 = "fd00:244::/64"
	refNet4 = "10.245.0.0/24"
)

// confLists are the two networks the demo attaches pods to: ebpf-cni as
// the primary plugin exactly as README.md installs it (cniVersion 1.0.0 and cniVersions,
// the capabilities runtimes pass), with bpfRoot, stateDir and socketCgroupPath
// pointed at the demo's own; and Debian's reference chain with the same
// features (bridge with masquerade + host-local + portmap + bandwidth, on
// iptables) for the side-by-side figures.
func confLists(bpfRoot, stateDir, cgroupPath, tmp string) (ebpf, ref []byte) {
	ebpf = fmt.Appendf(nil, `{
  "cniVersion": "1.0.0",
  "cniVersions": ["1.0.0", "1.1.0"],
  "name": "ebpf-cni",
  "plugins": [
    {
      "type": "ebpf-cni",
      "ipMasq": true,
      "capabilities": { "portMappings": true, "bandwidth": true, "ips": true, "mac": true },
      "ipam": {
        "type": "ebpf-ipam",
        "ranges": [ [{ "subnet": %q }], [{ "subnet": %q }] ]
      },
      "bpfRoot": %q, "stateDir": %q, "socketCgroupPath": %q
    }
  ]
}`, podNet4, podNet6, bpfRoot, stateDir, cgroupPath)
	ref, _ = json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": "ref", "plugins": []any{
		map[string]any{"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true,
			"ipam": map[string]any{"type": "host-local", "dataDir": filepath.Join(tmp, "host-local"),
				"ranges": []any{[]any{map[string]any{"subnet": refNet4}}}, "routes": []any{map[string]any{"dst": "0.0.0.0/0"}}}},
		map[string]any{"type": "portmap", "capabilities": map[string]any{"portMappings": true}},
		map[string]any{"type": "bandwidth", "capabilities": map[string]any{"bandwidth": true}},
	}})
	return ebpf, ref
}
