package plugin

import (
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
)

// prevResult is the result of the plugins before ebpf-cni in the list (nil
// when it is the first): ADD passes it on with its own added, as the spec
// asks of a plugin in a chain. One that does not decode is an error before
// anything is made.
func prevResult(c *Config) (*current.Result, error) {
	if c.RawPrevResult == nil {
		return nil, nil
	}
	if err := version.ParsePrevResult(&c.NetConf.NetConf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "decoding prevResult", err.Error())
	}
	prev, err := current.NewResultFromResult(c.PrevResult)
	if err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "converting prevResult", err.Error())
	}
	if err := checkResult(prev); err != nil {
		return nil, err
	}
	return prev, nil
}

// checkResult refuses a prevResult that contradicts itself, as a runtime
// must never get it back from ADD nor have it accepted by CHECK: an address
// whose interface index is not one of the result's interfaces (code 7,
// naming prevResult.ips[i].interface). An address without an index is
// allowed (the spec makes it optional).
func checkResult(r *current.Result) error {
	for i, ipc := range r.IPs {
		if ipc == nil {
			return invalidConfig(fmt.Sprintf("prevResult.ips[%d]", i), "null instead of an address")
		}
		if ipc.Interface == nil {
			continue
		}
		if idx := *ipc.Interface; idx < 0 || idx >= len(r.Interfaces) {
			return invalidConfig(fmt.Sprintf("prevResult.ips[%d].interface", i),
				fmt.Sprintf("%d is not the index of one of the %d interfaces of prevResult", idx, len(r.Interfaces)))
		}
	}
	return nil
}

// chainResult puts ebpf-cni's own result after prev's interfaces, addresses
// and routes (its addresses' interface indexes move along); DNS is
// ebpf-cni's when it has any, else prev's.
func chainResult(prev, own *current.Result) *current.Result {
	if prev == nil {
		return own
	}
	out := prev // parsed for this call alone
	out.CNIVersion = own.CNIVersion
	shift := len(out.Interfaces)
	out.Interfaces = append(out.Interfaces, own.Interfaces...)
	for _, ipc := range own.IPs {
		if ipc.Interface != nil {
			ipc.Interface = current.Int(*ipc.Interface + shift)
		}
		out.IPs = append(out.IPs, ipc)
	}
	out.Routes = append(out.Routes, own.Routes...)
	if !dnsEmpty(own.DNS) {
		out.DNS = own.DNS
	}
	return out
}

func dnsEmpty(d types.DNS) bool {
	return len(d.Nameservers) == 0 && len(d.Search) == 0 && len(d.Options) == 0 && d.Domain == ""
}

// forVersion drops what a result of an older spec version must not carry:
// the interfaces' mtu, socketPath and pciID and the routes' mtu, advmss,
// priority, table and scope came with 1.1.0 (a 1.0.0 result shares the Go
// type, so the conversion keeps them).
func forVersion(r *current.Result, cniVersion string) {
	if ok, err := version.GreaterThanOrEqualTo(cniVersion, "1.1.0"); err == nil && ok {
		return
	}
	for _, i := range r.Interfaces {
		i.Mtu, i.SocketPath, i.PciID = 0, "", ""
	}
	for _, rt := range r.Routes {
		rt.MTU, rt.AdvMSS, rt.Priority, rt.Table, rt.Scope = 0, 0, 0, nil, nil
	}
}
