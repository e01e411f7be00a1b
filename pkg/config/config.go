// Package config holds what every binary of ebpf-cni agrees on about its
// configuration: the default state locations and the one error type that
// names a bad key. It imports nothing of the project, so ebpf-ipam, the
// plugin, the features and the CLI all use it.
package config

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
)

// Defaults of the state locations: ebpf-cni's bpfRoot and stateDir, which
// ebpf-ipam and the operator CLI default to as well.
const (
	DefaultBPFRoot  = "/sys/fs/bpf/ebpf-cni"
	DefaultStateDir = "/run/ebpf-cni"
)

// StateDirOr is stateDir, or the default when the configuration names none.
func StateDirOr(stateDir string) string {
	if stateDir == "" {
		return DefaultStateDir
	}
	return stateDir
}

// Error is a bad configuration value; Key names it as the user wrote it
// ("runtimeConfig.portMappings[0].hostPort", "ipam.subnet").
type Error struct{ Key, Msg string }

func (e *Error) Error() string { return fmt.Sprintf("invalid %s: %s", e.Key, e.Msg) }

// Invalid is the Error of key, its message formatted.
func Invalid(key, format string, a ...any) *Error {
	return &Error{Key: key, Msg: fmt.Sprintf(format, a...)}
}

// CNI is the error as the CNI spec reports it: code 7, invalid network
// configuration, its message naming the key.
func (e *Error) CNI() *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, e.Error(), "")
}

// AsCNI returns the CNI error of the *Error in err's chain, if there is one.
func AsCNI(err error) (*types.Error, bool) {
	var ce *Error
	if errors.As(err, &ce) {
		return ce.CNI(), true
	}
	return nil, false
}

// The rules of keys two configurations share (the plugin's network
// configuration and the installer's options, pkg/conflist), written once.

// MaxVNI is the largest VXLAN network identifier (24 bits).
const MaxVNI = 1<<24 - 1

// VXLANPort checks the overlay's UDP port (vxlanPort); 0 is unset.
func VXLANPort(port int) error {
	if port != 0 && (port < 1 || port > 65535) {
		return Invalid("vxlanPort", "%d is outside 1..65535", port)
	}
	return nil
}

// VXLANVNI checks the overlay's network identifier (vxlanVNI); 0 is unset.
func VXLANVNI(vni int) error {
	if vni != 0 && (vni < 1 || vni > MaxVNI) {
		return Invalid("vxlanVNI", "%d is outside 1..%d", vni, MaxVNI)
	}
	return nil
}

// ClusterCIDR checks one of the cluster's pod ranges (clusterCIDRs) of
// prefix length bits: a range that covers every address would leave
// nothing outside the cluster (Services, the world).
func ClusterCIDR(key, cidr string, bits int) error {
	if bits == 0 {
		return Invalid(key, "%q covers every address: the pod ranges exclude the Service range and the world", cidr)
	}
	return nil
}
