package maps

// CString copies s into a fixed-size, NUL-terminated C char array as bpf2go
// represents it; s must be shorter than the array.
func CString[T ~int8 | ~uint8](dst []T, s string) {
	clear(dst)
	for i := 0; i < len(s) && i < len(dst)-1; i++ {
		dst[i] = T(s[i])
	}
}

// GoString reads a NUL-terminated C char array.
func GoString[T ~int8 | ~uint8](src []T) string {
	b := make([]byte, 0, len(src))
	for _, c := range src {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}
