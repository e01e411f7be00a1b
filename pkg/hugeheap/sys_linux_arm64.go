package hugeheap

// System call numbers and flags of linux/arm64 (package syscall's, which
// this package may not import).
const (
	sysRead       = 63
	sysWrite      = 64
	sysClose      = 57
	sysMincore    = 232
	sysMadvise    = 233
	sysOpenat     = 56
	sysPrctl      = 167
	sysGetdents64 = 61
	oRDONLY       = 0x0
	oWRONLY       = 0x1
	oDIRECTORY    = 0x4000
	oCLOEXEC      = 0x80000
	madvHugepage  = 14
)
