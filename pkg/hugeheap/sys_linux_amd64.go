package hugeheap

// System call numbers and flags of linux/amd64 (package syscall's, which
// this package may not import).
const (
	sysRead      = 0
	sysClose     = 3
	sysMincore   = 27
	sysMadvise   = 28
	sysOpenat    = 257
	oRDONLY      = 0x0
	oCLOEXEC     = 0x80000
	madvHugepage = 14
)
