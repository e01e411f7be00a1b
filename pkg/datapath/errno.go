package datapath

import "golang.org/x/sys/unix"

var (
	errExist = unix.EEXIST
	errNoDev = unix.ENODEV
)
