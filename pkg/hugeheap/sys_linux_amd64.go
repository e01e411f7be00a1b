package hugeheap

// System call numbers and flags of linux/amd64 (package syscall's, which
// this package may not import).
const (
	sysRead       = 0
	sysWrite      = 1
	sysClose      = 3
	sysMincore    = 27
	sysMadvise    = 28
	sysOpenat     = 257
	sysPrctl      = 157
	sysGetdents64 = 217
	oRDONLY       = 0x0
	oWRONLY       = 0x1
	oDIRECTORY    = 0x10000
	oCLOEXEC      = 0x80000
	madvHugepage  = 14
)
