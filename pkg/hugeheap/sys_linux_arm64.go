package hugeheap

// System call numbers and flags of linux/arm64 (package syscall's, which
// this package may not import).
const (
	sysRead      = 63
	sysClose     = 57
	sysMincore   = 232
	sysMadvise   = 233
	sysOpenat    = 56
	oRDONLY      = 0x0
	oCLOEXEC     = 0x80000
	madvHugepage = 14
)
