//go:build !linux || !(amd64 || arm64)

package hugeheap

// Elsewhere init leaves the heap where it is (sysMadvise zero) and the
// threads' timer slack as it is (sysGetdents64 zero), and only turns the
// collector off.
const (
	sysRead, sysWrite, sysClose, sysMincore, sysMadvise, sysOpenat, sysGetdents64, sysPrctl = 0, 0, 0, 0, 0, 0, 0, 0
	oRDONLY, oWRONLY, oDIRECTORY, oCLOEXEC, madvHugepage                                    = 0, 0, 0, 0, 0
)
