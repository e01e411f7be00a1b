package plugin

import (
	"encoding/json"
	"errors"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/repair"
)

// CmdStatus reports whether an ADD can succeed now: bpffs mounted, the
// programs loaded and pinned (the first STATUS after boot loads them, so the
// first pod does not pay for it), and the IPAM plugin ready.
func CmdStatus(args *skel.CmdArgs) (err error) {
	w := newWatch()
	cl := startCall("STATUS", args, w)
	defer func() { cl.end(err) }()
	c, err := ParseConfig(args.StdinData, args.Args, false)
	if err != nil {
		return err
	}
	mode, err := attach.ParseMode(c.AttachMode)
	if err != nil {
		return invalidConfig("attachMode", err.Error())
	}
	if err := kernelSupports(mode); err != nil {
		return types.NewError(types.ErrPluginNotAvailable, err.Error(), "")
	}
	if err := podRangeConfigured(c); err != nil {
		return err
	}
	if err := maps.CheckBPFFS(c.BPFRoot); err != nil {
		return cniError(types.ErrPluginNotAvailable, "bpfRoot unusable", err)
	}
	w.lap("parse")
	// Shared, as the other verbs: loading takes the node lock exclusively
	// for that moment, and so does the release of the node's last
	// endpoint when healing reclaimed it.
	n, err := openNode(c, node.Shared, w)
	if err != nil {
		return err
	}
	cl.opened(n)
	defer n.Close()
	defer func() { logTiming("STATUS", args, n, err) }()
	n.Phase("programs")
	if _, err := n.Programs(); err != nil {
		return cniError(types.ErrPluginNotAvailable, "datapath programs unavailable", err)
	}
	// containerd 2.x calls STATUS every 5 s: the kernel and the records
	// are compared and mended here (heal.go).
	n.Phase("heal")
	healed, err := repair.Verb(n, c.Network(), "")
	cl.healed += healed
	if err != nil {
		msg := "repairing the node's state failed: existing pods may have lost connectivity"
		if errors.Is(err, repair.ErrLost) {
			msg = "existing pods lost part of their network state"
		}
		return types.NewError(types.ErrLimitedConnectivity, msg+": "+err.Error(),
			"run ebpf-cni status in the node's network namespace for what is wrong, and ebpf-cni repair")
	}
	n.Phase("ipam")
	if err := c.ipam().Status(args, c); err != nil {
		// An IPAM plugin that cannot allocate makes ADD fail: for the
		// runtime that is "not available" (50), whatever IPAM's own code.
		msg, details := "IPAM plugin "+c.IPAMType+" not available", err.Error()
		var te *types.Error
		if errors.As(err, &te) {
			msg, details = msg+": "+te.Msg, te.Details
		}
		return types.NewError(types.ErrPluginNotAvailable, msg, details)
	}
	return nil
}

// podRangeConfigured fails while the IPAM section names no pod range: a
// node whose range is not known yet (on Kubernetes, a Node object without
// spec.podCIDRs) must say what is missing, not fail every ADD later.
func podRangeConfigured(c *Config) error {
	if c.IPAMType != DefaultIPAM && c.IPAMType != "host-local" {
		return nil
	}
	var n struct {
		IPAM struct {
			Subnet string            `json:"subnet"`
			Ranges []json.RawMessage `json:"ranges"`
		} `json:"ipam"`
	}
	if json.Unmarshal(c.IPAMConf, &n) != nil || n.IPAM.Subnet != "" || len(n.IPAM.Ranges) > 0 {
		return nil // anything else wrong there is the IPAM plugin's to report
	}
	return types.NewError(types.ErrPluginNotAvailable, "no pod range configured for this node",
		"ipam.ranges is empty: give it the node's pod range (make install POD_CIDR=..., or ebpf-cni conflist --pod-cidr); "+
			"on Kubernetes, the Node object needs spec.podCIDRs (kube-controller-manager --allocate-node-cidrs with --cluster-cidr) "+
			"and the ebpf-cni DaemonSet then writes the configuration")
}
