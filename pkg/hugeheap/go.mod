// A module of its own so that its import path sorts before every other
// package's and its init runs first (hugeheap.go's package comment).
module 0hugeheap

go 1.26.0
