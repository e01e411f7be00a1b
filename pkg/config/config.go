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
