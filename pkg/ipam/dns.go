package ipam

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/config"
)

// MaxResolvConf is the largest ipam.resolvConf read, in bytes. A
// resolv.conf is a few hundred bytes (glibc reads 3 nameservers, 6 search
// domains); a bigger file is not one, and a bound keeps an ADD that holds
// the node lock shared from reading without end. A larger file is refused.
const MaxResolvConf = 64 << 10

// readResolvConf reads path, a regular file of at most MaxResolvConf
// bytes. Anything else is a configuration error naming ipam.resolvConf: a
// FIFO blocks an open for reading until a writer comes, a character device
// (/dev/urandom) never ends, and ADD and STATUS must not wait on either. The
// type is checked before the open (opening a device can do things) and again
// on the open file (the path may change between the two); O_NONBLOCK keeps
// that open from waiting on a FIFO put there meanwhile.
func readResolvConf(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if err := regularResolvConf(path, fi); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err = f.Stat(); err != nil {
		return nil, err
	}
	if err := regularResolvConf(path, fi); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxResolvConf+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxResolvConf { // it grew since the stat
		return nil, config.Invalid("ipam.resolvConf", "%q is over %d bytes; at most %d", path, MaxResolvConf, MaxResolvConf)
	}
	return b, nil
}

func regularResolvConf(path string, fi os.FileInfo) error {
	if !fi.Mode().IsRegular() {
		return config.Invalid("ipam.resolvConf", "%q is not a regular file (%s): a resolv.conf-format file is", path, fileKind(fi.Mode()))
	}
	if fi.Size() > MaxResolvConf {
		return config.Invalid("ipam.resolvConf", "%q is %d bytes; at most %d", path, fi.Size(), MaxResolvConf)
	}
	return nil
}

func fileKind(m os.FileMode) string {
	switch {
	case m&os.ModeNamedPipe != 0:
		return "a FIFO"
	case m&os.ModeCharDevice != 0:
		return "a character device"
	case m&os.ModeDevice != 0:
		return "a block device"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m.IsDir():
		return "a directory"
	}
	return fmt.Sprintf("mode %s", m.Type())
}

// parseResolvConf reads nameserver, domain, search and options lines of a
// resolv.conf-format file into a CNI DNS section, as host-local does.
func parseResolvConf(b []byte) (*types.DNS, error) {
	dns := &types.DNS{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		switch fields[0] {
		case "nameserver":
			dns.Nameservers = append(dns.Nameservers, fields[1])
		case "domain":
			dns.Domain = fields[1]
		case "search":
			dns.Search = append(dns.Search, fields[1:]...)
		case "options":
			dns.Options = append(dns.Options, fields[1:]...)
		}
	}
	return dns, sc.Err()
}
