package ipam

// Plugin error codes of ebpf-ipam (the CNI spec reserves 0-99). They are
// documented in README.md; keep the two in step.
const (
	// ErrRangeFull: a range set has no free address left.
	ErrRangeFull uint = 100
	// ErrAddressInUse: a requested address is held by another attachment.
	ErrAddressInUse uint = 101
	// ErrAddressNotInRange: a requested address is outside every range set.
	ErrAddressNotInRange uint = 102
	// ErrStateUnavailable: bpffs or the state directory cannot be used.
	ErrStateUnavailable uint = 103
	// ErrNetworkIDClash: two network names hash to the same network ID.
	ErrNetworkIDClash uint = 104
	// ErrAllocationMismatch: CHECK found the allocation differs from what
	// the runtime expects.
	ErrAllocationMismatch uint = 105
	// ErrMapFull: a node-wide map of ebpf-ipam (ipam_allocs, ipam_cursors,
	// ipam_nets) has no room left; the message names it and the remedy.
	// Not 103: the state is usable, there is only no room in it.
	ErrMapFull uint = 106
)
