package plugin

import (
	"errors"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/config"
)

// Plugin error codes of ebpf-cni's core steps. The CNI spec reserves 0-99;
// ebpf-ipam uses 100-109; the node's state and the features own theirs
// (node.ErrBPFFS, endpoint.ErrConflict, nat.ErrMasquerade...):
// docs/development.md lists them all, README.md documents them.
const (
	// ErrInterfaceExists: CNI_IFNAME already exists in the pod's netns, or
	// the attachment's host veth already exists on the node.
	ErrInterfaceExists uint = 110
	// ErrLinkSetup: creating or configuring the veth pair, its addresses,
	// routes or sysctls failed.
	ErrLinkSetup uint = 114
	// ErrCheckFailed: CHECK found the attachment differs from prevResult or
	// from what ADD made; the message names every difference.
	ErrCheckFailed uint = 116
	// ErrIPAM: the IPAM plugin failed (its own error is in details).
	ErrIPAM uint = 117
	// ErrKernelFeature: the configuration asks for a kernel feature this
	// kernel lacks (the message names the key and the feature; see
	// docs/kernels.md); nothing was made.
	ErrKernelFeature uint = 123
)

func invalidConfig(key, msg string) error { return config.Invalid(key, "%s", msg).CNI() }

func cniError(code uint, msg string, err error) error {
	details := ""
	if err != nil {
		details = err.Error()
		msg = msg + ": " + details
	}
	return types.NewError(code, msg, details)
}

// ipamError passes the IPAM plugin's own CNI error through (it names the
// bad key), and wraps anything else.
func ipamError(verb string, err error) error {
	var te *types.Error
	// Code 0 is no error code: libcni reports a result it cannot parse so.
	if errors.As(err, &te) && te.Code != 0 {
		return te
	}
	return cniError(ErrIPAM, "IPAM "+verb, err)
}
