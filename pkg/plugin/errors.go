package plugin

import (
	"errors"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/config"
	"github.com/ebpf-cni/ebpf-cni/pkg/errcode"
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
	return cniError(errcode.IPAM, "IPAM "+verb, err)
}
