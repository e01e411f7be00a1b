package plugin

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/repair"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// CmdDel removes everything the attachment has; what is already gone is
// success. It needs neither the pod's netns nor a valid full configuration.
func CmdDel(args *skel.CmdArgs) (err error) {
	w := newWatch()
	cl := startCall("DEL", args, w)
	defer func() { cl.end(err) }()
	noSkelNetNSCheck(args)
	c, err := ParseConfig(args.StdinData, args.Args, false)
	if err != nil {
		return err
	}
	w.lap("parse")
	n, err := openNode(c, node.Shared, w)
	if err != nil {
		return err
	}
	cl.opened(n)
	defer n.Close()
	defer func() { logTiming("DEL", args, n, err) }()

	hostName := veth.HostName(args.ContainerID, args.IfName)
	al, err := n.AttachmentLock(hostName)
	if err != nil {
		return cniError(types.ErrIOFailure, "locking the attachment (stateDir)", err)
	}
	defer al.Unlock()
	var errs []error
	if rec, err := n.Record(hostName); err == nil && rec.OwnTable && args.Netns != "" {
		// A second interface's source rules (veth.ownTable) live in the pod.
		if err := veth.RemoveOwnRules(args.Netns, rec.Addrs()); err != nil {
			errs = append(errs, err)
		}
	}
	n.Phase("teardown")
	if err := repair.Teardown(n, hostName); err != nil {
		errs = append(errs, err)
	}
	n.Phase("ipam")
	if err := c.ipam().Del(args, c); err != nil {
		if len(errs) == 0 {
			return ipamError("DEL", err) // IPAM's own error, as it gave it
		}
		errs = append(errs, fmt.Errorf("IPAM DEL: %w", err))
	}
	if len(errs) > 0 {
		return cniError(types.ErrIOFailure, fmt.Sprintf("deleting %s/%s", args.ContainerID, args.IfName), errors.Join(errs...))
	}
	n.Phase("release")
	al.Unlock()
	n.ReleaseIfEmpty(func() { _ = repair.Release(n) })
	return nil
}
