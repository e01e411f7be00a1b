// Package errcode is the one registry of the CNI error codes ebpf-cni and
// ebpf-ipam return: their own codes (100 and up; the spec reserves 0-99)
// as constants, and the spec's well-known codes they use, each with the
// package that returns it, its meaning and the page of docs/ whose error
// table documents it. Its tests fail when two entries share a code, an
// entry has no row in its page, a package declares a code of its own, or
// the code uses a well-known code the registry does not list.
//
// A new code: a constant here, its entry in Codes, a row in the page.
package errcode

import "github.com/containernetworking/cni/pkg/types"

// ebpf-ipam's codes (pkg/ipam; docs/ipam.md).
const (
	// RangeFull: a range set has no free address left.
	RangeFull uint = 100
	// AddressInUse: a requested address is held by another attachment.
	AddressInUse uint = 101
	// AddressNotInRange: a requested address is outside every range set.
	AddressNotInRange uint = 102
	// StateUnavailable: bpffs or the state directory cannot be used.
	StateUnavailable uint = 103
	// NetworkIDClash: two network names hash to the same network ID.
	NetworkIDClash uint = 104
	// AllocationMismatch: CHECK found the allocation differs from what
	// the runtime expects.
	AllocationMismatch uint = 105
	// MapFull: a node-wide map of ebpf-ipam (ipam_allocs, ipam_cursors,
	// ipam_nets) has no room left; the message names it and the remedy.
	// Not StateUnavailable: the state is usable, there is only no room in it.
	MapFull uint = 106
)

// ebpf-cni's codes (docs/configuration.md).
const (
	// InterfaceExists: CNI_IFNAME already exists in the pod's netns, or
	// the attachment's host veth already exists on the node.
	InterfaceExists uint = 110
	// BPFFS: bpfRoot is not on a mounted bpf filesystem or not usable.
	BPFFS uint = 111
	// ProgramLoad: the datapath programs could not be loaded, verified or
	// pinned.
	ProgramLoad uint = 112
	// Attach: a program could not be attached to the host veth.
	Attach uint = 113
	// LinkSetup: creating or configuring the veth pair, its addresses,
	// routes or sysctls failed.
	LinkSetup uint = 114
	// AddressConflict: an address from IPAM is already mapped to another
	// live endpoint of the node.
	AddressConflict uint = 115
	// CheckFailed: CHECK found the attachment differs from prevResult or
	// from what ADD made; the message names every difference.
	CheckFailed uint = 116
	// IPAM: the IPAM plugin failed (its own error is in details).
	IPAM uint = 117
	// Masquerade: masquerade could not be set up (uplink programs or
	// maps); a bad masquerade key is code 7 instead.
	Masquerade uint = 118
	// Bandwidth: the bandwidth buckets could not be written; a bad
	// bandwidth key is code 7 instead.
	Bandwidth uint = 119
	// HostPortConflict: a port mapping is held by another pod (the
	// message names it); nothing of the ADD remains.
	HostPortConflict uint = 120
	// HostPort: port mappings could not be set up (maps, socket hooks,
	// uplink programs); a bad mapping is code 7 instead.
	HostPort uint = 121
	// Cluster: the cluster's routing or overlay could not be set up
	// (clusterCIDRs, the VXLAN device, the uplinks' programs); a bad
	// cluster key is code 7 instead.
	Cluster uint = 122
	// KernelFeature: the configuration asks for a kernel feature this
	// kernel lacks (the message names the key and the feature; see
	// docs/kernels.md); nothing was made.
	KernelFeature uint = 123
)

// Code is one error code the project returns.
type Code struct {
	Code    uint
	Name    string   // the Go constant: errcode's own, or the spec's in cni/pkg/types
	Owner   string   // the package that returns it; "" for a well-known code several return
	Meaning string   // in short (the pages say it for operators)
	Docs    []string // pages of docs/ with a row "| <code> |" for it
}

const (
	cniDoc  = "configuration.md"
	ipamDoc = "ipam.md"
)

// Codes lists every code ebpf-cni and ebpf-ipam return, the spec's first.
var Codes = []Code{
	{types.ErrIncompatibleCNIVersion, "ErrIncompatibleCNIVersion", "", "cniVersion unsupported or invalid", []string{cniDoc, ipamDoc}},
	{types.ErrInvalidEnvironmentVariables, "ErrInvalidEnvironmentVariables", "", "a CNI_* variable is missing or invalid", []string{cniDoc, ipamDoc}},
	{types.ErrIOFailure, "ErrIOFailure", "", "reading or writing state failed", []string{cniDoc, ipamDoc}},
	{types.ErrDecodingFailure, "ErrDecodingFailure", "", "the configuration or prevResult is not valid JSON of its type", []string{cniDoc, ipamDoc}},
	{types.ErrInvalidNetworkConfig, "ErrInvalidNetworkConfig", "", "a configuration key is invalid (the message names it)", []string{cniDoc, ipamDoc}},
	{types.ErrTryAgainLater, "ErrTryAgainLater", "pkg/ipam", "the network's lock is held too long", []string{ipamDoc}},
	{types.ErrPluginNotAvailable, "ErrPluginNotAvailable", "", "STATUS: not available", []string{cniDoc, ipamDoc}},
	{types.ErrLimitedConnectivity, "ErrLimitedConnectivity", "pkg/plugin", "STATUS: not available, and existing pods are damaged", []string{cniDoc}},
	{types.ErrInternal, "ErrInternal", "pkg/plugin", "a feature failed without a code of its own", []string{cniDoc}},

	{RangeFull, "RangeFull", "pkg/ipam", "no free address left in a range set", []string{ipamDoc}},
	{AddressInUse, "AddressInUse", "pkg/ipam", "a requested address is held by another attachment", []string{ipamDoc}},
	{AddressNotInRange, "AddressNotInRange", "pkg/ipam", "a requested address is outside every range", []string{ipamDoc}},
	{StateUnavailable, "StateUnavailable", "pkg/ipam", "bpffs or the state directory cannot be used", []string{ipamDoc}},
	{NetworkIDClash, "NetworkIDClash", "pkg/ipam", "two network names have the same network ID", []string{ipamDoc}},
	{AllocationMismatch, "AllocationMismatch", "pkg/ipam", "CHECK found the allocation differs", []string{ipamDoc}},
	{MapFull, "MapFull", "pkg/ipam", "a node-wide map of ebpf-ipam is full", []string{ipamDoc}},

	{InterfaceExists, "InterfaceExists", "pkg/plugin", "interface or attachment exists", []string{cniDoc}},
	{BPFFS, "BPFFS", "pkg/node", "bpfRoot not on bpffs, or the maps unusable", []string{cniDoc}},
	{ProgramLoad, "ProgramLoad", "pkg/node", "programs could not be loaded, verified or pinned", []string{cniDoc}},
	{Attach, "Attach", "pkg/endpoint", "a program could not be attached to the host veth", []string{cniDoc}},
	{LinkSetup, "LinkSetup", "pkg/plugin", "veth, addresses, routes or sysctls", []string{cniDoc}},
	{AddressConflict, "AddressConflict", "pkg/endpoint", "an address is mapped to another live endpoint", []string{cniDoc}},
	{CheckFailed, "CheckFailed", "pkg/plugin", "CHECK found differences", []string{cniDoc}},
	{IPAM, "IPAM", "pkg/plugin", "the IPAM plugin failed", []string{cniDoc}},
	{Masquerade, "Masquerade", "pkg/nat", "masquerade could not be set up", []string{cniDoc}},
	{Bandwidth, "Bandwidth", "pkg/bandwidth", "the buckets could not be written", []string{cniDoc}},
	{HostPortConflict, "HostPortConflict", "pkg/portmap", "a port is held by another pod", []string{cniDoc}},
	{HostPort, "HostPort", "pkg/portmap", "port mappings could not be set up", []string{cniDoc}},
	{Cluster, "Cluster", "pkg/cluster", "the cluster's ranges or the overlay could not be set up", []string{cniDoc}},
	{KernelFeature, "KernelFeature", "pkg/plugin", "the configuration asks for a kernel feature this kernel lacks", []string{cniDoc}},
}
