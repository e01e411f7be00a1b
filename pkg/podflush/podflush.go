// Package podflush deletes a pod's entries from the node's big LRU tables
// (nat, flows) at DEL without reading them: programs of the set
// (bpf/flush.c) walk a table in the kernel and delete the entries of the
// addresses they are given.
//
// On a node whose pods talk to the world a lot, the LRU keeps those tables
// full (131,072 and 65,536 entries), and reading them into the plugin
// cost every DEL there 40-45 ms of its own and as much CPU. A node whose
// pinned programs lack these (another build's, not upgraded yet) gets the
// caller's walk.
package podflush

import (
	"net"
	"unsafe"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
)

// The programs, by the table they walk.
const (
	NAT   = "flush_nat"   // nat
	Flows = "flush_flows" // flows
)

// Objects is the programs' object, which every node loads with the
// others (the flows feature, which every pod has, brings it).
func Objects() []programs.Object {
	return []programs.Object{{Name: "flush", Bytes: _FlushBytes, Load: LoadFlush, Runs: []string{NAT, Flows}}}
}

// Pod is an address whose entries go, and the tables (of nat, the
// directions) they go from.
type Pod struct {
	IP     net.IP
	Tables maps.CniFlushTables
}

// Flush deletes the entries of pods from the table program walks (NAT or
// Flows), with this build's programs, and returns how many it deleted.
// Where it cannot run the program (the node's pinned programs are another
// build's, which lack it; the kernel refuses the run), it calls walk,
// which must do the same by reading the table: a DEL's flush never fails
// for want of the fast way.
func Flush(n *node.Node, program string, pods []Pod, walk func() (int, error)) (int, error) {
	if len(pods) == 0 {
		return 0, nil
	}
	prog, err := programs.Pinned(n.BPFRoot(), n.Tag(), program)
	if err != nil {
		return walk()
	}
	defer prog.Close()
	// One address once, with every table asked for it.
	var list []maps.CniFlushPod
	at := map[string]int{}
	for _, p := range pods {
		i, ok := at[string(p.IP.To16())]
		if !ok {
			i = len(list)
			at[string(p.IP.To16())] = i
			list = append(list, maps.CniFlushPod{Family: maps.Family(p.IP), Addr: maps.Addr16(p.IP)})
		}
		list[i].Tables |= uint32(p.Tables)
	}
	deleted := 0
	for len(list) > 0 {
		var a maps.CniFlushArgs
		a.N = uint32(copy(a.Pods[:], list))
		list = list[a.N:]
		r, err := programs.Run(prog, unsafe.Slice((*byte)(unsafe.Pointer(&a)), unsafe.Sizeof(a)))
		if err != nil {
			w, err := walk()
			return deleted + w, err
		}
		deleted += int(r)
	}
	return deleted, nil
}
