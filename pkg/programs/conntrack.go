package programs

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/cilium/ebpf/btf"
	"github.com/vishvananda/netlink"
)

// Conntrack says whether the kernel offers netfilter's conntrack to BPF
// programs (the bpf_skb_ct_lookup kfunc), which the datapath needs to tell
// the flows netfilter translated (kube-proxy's Services) from the others
// (bpf/lib/flow.h). Without it every flow takes the fast path after its
// first packets, and Services through netfilter do not work.
type Conntrack struct {
	Available bool
	// OptsSize is the size of the kernel's struct bpf_ct_opts: 12 before
	// kernel 6.10, 16 since (the kfunc accepts both on newer kernels).
	OptsSize uint32
	Detail   string
}

var (
	conntrackOnce sync.Once
	conntrack     Conntrack
)

// ProbeConntrack looks for the conntrack kfuncs in the kernel's BTF and in
// the nf_conntrack module's (Debian builds conntrack as a module: its
// kfuncs exist only while it is loaded). The answer is cached: the
// programs are loaded once per node.
func ProbeConntrack() Conntrack {
	conntrackOnce.Do(func() { conntrack = probeConntrack() })
	return conntrack
}

func probeConntrack() Conntrack {
	vmlinux, err := btf.LoadKernelSpec()
	if err != nil {
		return Conntrack{Detail: fmt.Sprintf("no kernel BTF: %v", err)}
	}
	specs := []*btf.Spec{vmlinux}
	where := "built in"
	if _, err := vmlinux.AnyTypeByName("bpf_skb_ct_lookup"); err != nil {
		mod, merr := btf.LoadKernelModuleSpec("nf_conntrack")
		if moduleNotLoaded(merr) {
			// Not loaded yet (kube-proxy loads it when it starts, maybe
			// after the node's first pod). A conntrack dump over netlink
			// makes the kernel load it, as the conntrack tool does; with
			// the module absent there is nothing to dump.
			_, _ = netlink.ConntrackTableList(netlink.ConntrackTable, netlink.FAMILY_V4)
			mod, merr = btf.LoadKernelModuleSpec("nf_conntrack")
		}
		if merr != nil {
			if moduleNotLoaded(merr) {
				return Conntrack{Detail: "no bpf_skb_ct_lookup: nf_conntrack is neither built in nor loadable (load it before the node's first pod: the programs are loaded once per node)"}
			}
			return Conntrack{Detail: fmt.Sprintf("reading nf_conntrack's BTF: %v", merr)}
		}
		if _, err := mod.AnyTypeByName("bpf_skb_ct_lookup"); err != nil {
			return Conntrack{Detail: "nf_conntrack is loaded but has no bpf_skb_ct_lookup (kernel older than 5.18 or CONFIG_DEBUG_INFO_BTF_MODULES off)"}
		}
		specs = append(specs, mod)
		where = "module nf_conntrack"
	}
	c := Conntrack{Available: true, OptsSize: 12, Detail: "bpf_skb_ct_lookup (" + where + ")"}
	for _, s := range specs {
		if t, err := s.AnyTypeByName("bpf_ct_opts"); err == nil {
			if st, ok := t.(*btf.Struct); ok {
				c.OptsSize = st.Size
			}
			break
		}
	}
	return c
}

// moduleNotLoaded: a module's BTF is missing because the module is not
// loaded (no /sys/kernel/btf/<module>). cilium/ebpf returns the open's
// error for it, not btf.ErrNotFound: taking only the latter for "not
// loaded" skipped the load below on every kernel with nf_conntrack as a
// module (Debian's), so a node whose first pod came before kube-proxy
// loaded it ran its programs without conntrack.
func moduleNotLoaded(err error) bool {
	return errors.Is(err, os.ErrNotExist) || errors.Is(err, btf.ErrNotFound)
}
