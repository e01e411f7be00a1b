package ipam_test

import (
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

// The CNI_ARGS real runtimes send, from their sources: containerd's CRI
// (getPodCNILabels, K8S_POD_UID since 1.7), podman's libnetwork/cni
// (getRuntimeConfig: K8S_POD_NAME only, MAC and IP for --mac-address and
// --ip), and cnitool, which passes the user's CNI_ARGS as they are.
var runtimeArgs = []struct {
	runtime, args string
	want          string // the address the call must get, when it asks for one
}{
	{"containerd", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=4c3a9e0b1d2f;K8S_POD_UID=0b6f2a4c-6d1e-4f4a-9c33-5a7f1e2d3c4b;IgnoreUnknown=1", "10.170.0.2"},
	{"podman", "IgnoreUnknown=1;K8S_POD_NAME=web", ""},
	{"podman --ip --mac-address", "IgnoreUnknown=1;K8S_POD_NAME=web;MAC=0a:58:0a:aa:00:09;IP=10.170.0.9", "10.170.0.9"},
	{"cnitool IP", "IP=10.170.0.9", "10.170.0.9"},
	{"cnitool MAC (for the interface plugin)", "MAC=0a:58:0a:aa:00:09", ""},
	{"cnitool nothing", "", ""},
}

// No real runtime's call breaks, in any spec version; DEL after each.
func TestCNIArgsOfRealRuntimes(t *testing.T) {
	for _, ver := range testutil.SpecVersions {
		t.Run(ver, func(t *testing.T) {
			e := newEnv(t)
			stdin := e.conf(ver, `"subnet":"10.170.0.0/24"`)
			for _, rt := range runtimeArgs {
				got := ipsOf(e.add("c1", stdin, rt.args))
				require.Len(t, got, 1, rt.runtime)
				if rt.want != "" {
					require.Equal(t, rt.want, got[0], rt.runtime)
				} else {
					require.True(t, strings.HasPrefix(got[0], "10.170.0."), "%s: %s", rt.runtime, got[0])
				}
				e.run("DEL", "c1", stdin, rt.args).Must(t)
			}
			e.requireNothingHeld()
		})
	}
}

// Unknown keys without IgnoreUnknown and malformed pairs are code 4 naming
// the pair, as in host-local; nothing is allocated.
func TestCNIArgsErrors(t *testing.T) {
	e := newEnv(t)
	stdin := e.conf("1.1.0", `"subnet":"10.171.0.0/24"`)
	for _, tc := range []struct{ args, names string }{
		{"K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0", `"K8S_POD_NAMESPACE=default", "K8S_POD_NAME=web-0"`},
		{"IgnoreUnknown=0;FOO=1", `"FOO=1"`},
		{"IgnoreUnknown=1;IP", `"IP"`},
		{"IgnoreUnknown=1;=10.171.0.5", `"=10.171.0.5"`},
		{"IgnoreUnknown=maybe", `"IgnoreUnknown=maybe"`},
	} {
		cerr := e.run("ADD", "c1", stdin, tc.args).Error(t)
		require.Equal(t, uint(types.ErrInvalidEnvironmentVariables), cerr.Code, cerr.Msg)
		require.Contains(t, cerr.Msg, tc.names)
		e.requireNothingHeld()
	}
	// DEL does not read CNI_ARGS: whatever it carries, the release happens.
	e.add("c1", stdin, "")
	e.run("DEL", "c1", stdin, "FOO").Must(t)
	e.requireNothingHeld()
}

// CONVENTIONS.md: args.cni.ips given, CNI_ARGS IP is ignored.
func TestArgsIPsWinOverCNIArgsIP(t *testing.T) {
	e := newEnv(t)
	stdin := e.conf("1.0.0", `"subnet":"10.172.0.0/24"`, `"args":{"cni":{"ips":["10.172.0.20"]}}`)
	require.Equal(t, []string{"10.172.0.20"}, ipsOf(e.add("a", stdin, "IgnoreUnknown=1;IP=10.172.0.10")))
	// Not even read: a CNI_ARGS IP that is no address does not matter.
	e.run("DEL", "a", stdin, "").Must(t)
	require.Equal(t, []string{"10.172.0.20"}, ipsOf(e.add("b", stdin, "IP=bogus")))
	// Without args.cni.ips, CNI_ARGS IP is honoured.
	require.Equal(t, []string{"10.172.0.10"}, ipsOf(e.add("c", e.conf("1.0.0", `"subnet":"10.172.0.0/24"`), "IP=10.172.0.10")))
}
