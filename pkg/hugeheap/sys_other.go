//go:build !linux || !(amd64 || arm64)

package hugeheap

// Elsewhere init leaves the heap where it is (sysMadvise zero) and only
// turns the collector off.
const (
	sysRead, sysClose, sysMincore, sysMadvise, sysOpenat = 0, 0, 0, 0, 0
	oRDONLY, oCLOEXEC, madvHugepage                      = 0, 0, 0
)
