package maps

// Sizes of the C string fields, taken from the generated types so they can
// never drift from bpf/include/types.h.
const (
	CniContainerIDLen = len(CniIpamOwner{}.ContainerId)
	CniIfNameLen      = len(CniIpamOwner{}.Ifname)
	CniNetNameLen     = len(CniIpamNet{}.Name)
)
