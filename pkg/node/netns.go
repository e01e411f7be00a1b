package node

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
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

// ClaimNetns records the calling thread's network namespace as the node's
// (node_info): ADD calls it, since the host veth it makes lives there. A
// call of one build writes it once; every ADD after that only reads it.
func (n *Node) ClaimNetns() error {
	cookie, err := NetnsCookie()
	if err != nil {
		return err
	}
	m, err := n.Map(maps.CniMapNodeInfo)
	if err != nil {
		return err
	}
	var f maps.CniNodeFacts
	if m.Lookup(uint32(0), &f) == nil && f.NetnsCookie == cookie {
		return nil
	}
	f.NetnsCookie = cookie
	if err := m.Put(uint32(0), &f); err != nil {
		return fmt.Errorf("writing %s: %w", maps.CniMapNodeInfo, err)
	}
	return nil
}

// InNodeNetns reports whether the calling thread runs in the node's
// network namespace, as the kernel tells it: the one every ADD made its
// host veth in (node_info). Where no ADD wrote it yet (a node of an older
// build, a bpffs remounted since), a namespace that holds host veths of
// ebpf-cni, or whose devices ran the programs this call pinned the maps of
// again (Rescued), is the node's. why says how it was told, or why not.
// What destroys an endpoint whose host veth is not found asks this first:
// in another namespace every host veth looks gone.
func (n *Node) InNodeNetns() (ok bool, why string) {
	cookie, err := NetnsCookie()
	if err != nil {
		return false, err.Error()
	}
	if m, err := n.PinnedMap(maps.CniMapNodeInfo); err == nil && m != nil {
		var f maps.CniNodeFacts
		if m.Lookup(uint32(0), &f) == nil && f.NetnsCookie != 0 {
			if f.NetnsCookie == cookie {
				return true, "the network namespace ADD makes host veths in"
			}
			return false, fmt.Sprintf("not the network namespace ADD makes host veths in (netns cookie %d, the node's is %d in %s)", cookie, f.NetnsCookie, maps.CniMapNodeInfo)
		}
	}
	if len(n.Rescued) > 0 {
		return true, "its devices run the programs whose maps this call pinned again"
	}
	if names, err := veth.Candidates(); err == nil && len(names) > 0 {
		return true, "host veths of ebpf-cni live here"
	}
	return false, fmt.Sprintf("no ADD recorded the node's network namespace in %s and no host veth of ebpf-cni is here", maps.CniMapNodeInfo)
}

// IsNetNS reports whether path is a network namespace (nsfs): a bind
// mount undone leaves a plain file, a dead process no file.
func IsNetNS(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}
