package ipam

import (
	"fmt"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
)

// envArgs is what ebpf-ipam reads from CNI_ARGS ("K1=V1;K2=V2").
type envArgs struct {
	IP string // requested addresses, comma-separated; "" when not given
}

// knownArgs are the CNI_ARGS keys ebpf-ipam accepts without IgnoreUnknown:
// its own (IP), and MAC, which the interface plugin that runs ebpf-ipam
// reads (ebpf-cni, bridge...) from the same variable: an interface plugin
// passes CNI_ARGS on to its IPAM unchanged, so a MAC= that plugin takes
// would otherwise fail here.
var knownArgs = map[string]bool{"IP": true, "MAC": true, "IgnoreUnknown": true}

// parseEnvArgs reads CNI_ARGS as host-local does (types.LoadArgs): a pair
// without "=" or with an empty key is an error, and so is a key ebpf-ipam
// does not know unless IgnoreUnknown is 1 or true. The runtimes send
// unknown keys only with IgnoreUnknown=1 (containerd's K8S_POD_NAMESPACE,
// K8S_POD_NAME, K8S_POD_INFRA_CONTAINER_ID, K8S_POD_UID; podman's
// K8S_POD_NAME; kubelet's), and cnitool passes the user's own string: a
// typo there is reported instead of silently ignored. Unlike LoadArgs, a
// value may hold "=" (it is split at the first one) and empty segments
// (a trailing ";") are skipped: neither is ambiguous.
func parseEnvArgs(s string) (envArgs, error) {
	var (
		a       envArgs
		ignore  bool
		unknown []string
	)
	for _, pair := range strings.Split(s, ";") {
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok || k == "" {
			return envArgs{}, argsError(fmt.Sprintf("invalid CNI_ARGS pair %q: want KEY=VALUE", pair))
		}
		switch k {
		case "IP":
			a.IP = v
		case "IgnoreUnknown":
			switch strings.ToLower(v) {
			case "1", "true":
				ignore = true
			case "0", "false":
				ignore = false
			default:
				return envArgs{}, argsError(fmt.Sprintf("invalid CNI_ARGS pair %q: IgnoreUnknown is 1, true, 0 or false", pair))
			}
		default:
			if !knownArgs[k] {
				unknown = append(unknown, pair)
			}
		}
	}
	if len(unknown) > 0 && !ignore {
		return envArgs{}, argsError(fmt.Sprintf("unknown CNI_ARGS %s: ebpf-ipam reads IP (and lets MAC pass); add IgnoreUnknown=1 to pass other keys", quoteAll(unknown)))
	}
	return a, nil
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}

func argsError(msg string) error {
	return types.NewError(types.ErrInvalidEnvironmentVariables, msg, "")
}
