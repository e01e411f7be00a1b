package node

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// soNetnsCookie is SO_NETNS_COOKIE (linux/socket.h; not in x/sys yet).
const soNetnsCookie = 71

// NetnsCookie is the cookie of the calling thread's network namespace, as
// bpf_get_netns_cookie sees it.
func NetnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	v, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, soNetnsCookie)
	if err != nil {
		return 0, fmt.Errorf("reading the netns cookie: %w", err)
	}
	return v, nil
}
