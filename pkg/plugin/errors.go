package plugin

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/bandwidth"
	"github.com/ebpf-cni/ebpf-cni/pkg/nat"
	"github.com/ebpf-cni/ebpf-cni/pkg/portmap"
)

// Plugin error codes of ebpf-cni. The CNI spec reserves 0-99; ebpf-ipam
// uses 100-109. They are documented in README.md; keep the two in step.
const (
	// ErrInterfaceExists: CNI_IFNAME already exists in the pod's netns, or
	// the attachment's host veth already exists on the node.
	ErrInterfaceExists uint = 110
	// ErrBPFFS: bpfRoot is not on a mounted bpf filesystem or not usable.
	ErrBPFFS uint = 111
	// ErrProgramLoad: the datapath programs could not be loaded, verified
	// or pinned.
	ErrProgramLoad uint = 112
	// ErrAttach: a program could not be attached to the host veth.
	ErrAttach uint = 113
	// ErrLinkSetup: creating or configuring the veth pair, its addresses,
	// routes or sysctls failed.
	ErrLinkSetup uint = 114
	// ErrEndpointConflict: an address from IPAM is already mapped to
	// another live endpoint of the node.
	ErrEndpointConflict uint = 115
	// ErrCheckFailed: CHECK found the attachment differs from prevResult or
	// from what ADD made; the message names every difference.
	ErrCheckFailed uint = 116
	// ErrIPAM: the IPAM plugin failed (its own error is in details).
	ErrIPAM uint = 117
	// ErrMasquerade: masquerade could not be set up (uplink programs or
	// maps); a bad masquerade key is code 7 instead.
	ErrMasquerade uint = 118
	// ErrBandwidth: the pod's rate limits could not be written (bucket
	// map); a bad bandwidth key is code 7 instead.
	ErrBandwidth uint = 119
	// ErrHostPortConflict: a port mapping is held by another pod (the
	// message names it); nothing of the ADD remains.
	ErrHostPortConflict uint = 120
	// ErrHostPort: port mappings could not be set up (maps, socket hooks,
	// uplink programs); a bad mapping is code 7 instead.
	ErrHostPort uint = 121
	// ErrKernelFeature: the configuration asks for a kernel feature this
	// kernel lacks (the message names the key and the feature; see
	// docs/kernels.md); nothing was made.
	ErrKernelFeature uint = 123
)

// hostPortError turns a hostPort error into a CNI error: a bad key is an
// invalid configuration that names it, a taken port its own code.
func hostPortError(err error) error {
	var ce *portmap.ConfigError
	var ne *nat.ConfigError
	switch {
	case errors.As(err, &ce):
		return invalidConfig(ce.Key, ce.Msg)
	case errors.As(err, &ne):
		return invalidConfig(ne.Key, ne.Msg)
	case errors.Is(err, portmap.ErrConflict):
		return types.NewError(ErrHostPortConflict, err.Error(), "")
	}
	return cniError(ErrHostPort, "setting up port mappings", err)
}

// natError turns a masquerade error into a CNI error: a bad key is an
// invalid configuration that names it.
func natError(err error) error {
	var ce *nat.ConfigError
	if errors.As(err, &ce) {
		return invalidConfig(ce.Key, ce.Msg)
	}
	return cniError(ErrMasquerade, "setting up masquerade", err)
}

// bandwidthError turns a bandwidth error into a CNI error: a bad key is an
// invalid configuration that names it.
func bandwidthError(err error) error {
	var ce *bandwidth.ConfigError
	if errors.As(err, &ce) {
		return invalidConfig(ce.Key, ce.Msg)
	}
	return cniError(ErrBandwidth, "setting up bandwidth limits", err)
}

func invalidConfig(key, msg string) error {
	return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("invalid %s: %s", key, msg), "")
}

func cniError(code uint, msg string, err error) error {
	details := ""
	if err != nil {
		details = err.Error()
		msg = msg + ": " + details
	}
	return types.NewError(code, msg, details)
}
