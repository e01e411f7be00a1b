package repair

import (
	"errors"
	"fmt"
	"slices"

	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// Uninstall takes away what the plugin made on the node outside its pins
// and its state dir, for ebpf-cni-agent uninstall: every endpoint, whether
// its record or only its host veth is left, as DEL does (Teardown; a live
// pod loses its network: the caller refused while there were any, unless
// forced), then the node-wide state (Release): the features' programs on
// the node's devices and cgroup, the overlay's device, the pod ranges'
// unreachable routes. The caller holds the node lock exclusively; the pins
// and the state dir go after it (node.Node.RemovePins, RemoveStateDir).
// It returns one line per item removed, none on a node where nothing was
// left (a second run); every step runs whatever the others return.
func Uninstall(n *node.Node) ([]string, error) {
	var errs []error
	names, err := n.RecordNames()
	errs = append(errs, err)
	links, err := veth.HostLinks()
	errs = append(errs, err)
	for _, l := range links {
		if !slices.Contains(names, l.Attrs().Name) {
			names = append(names, l.Attrs().Name)
		}
	}
	slices.Sort(names)
	var done []string
	for _, name := range names {
		what := "endpoint " + name
		if rec, err := n.Record(name); err == nil {
			what = fmt.Sprintf("endpoint %s (%s/%s, network %s)", name, rec.ContainerID, rec.IfName, rec.Network)
		}
		if err := Teardown(n, name); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
			continue
		}
		done = append(done, what)
	}

	// What Release takes away, read before and after: its steps report
	// errors, not what they found.
	sets := func() []string {
		all, err := n.AttachmentSets("")
		errs = append(errs, err)
		var out []string
		for _, s := range all {
			out = append(out, fmt.Sprintf("programs of %s on %s", s.Owner, s.Name))
		}
		return out
	}
	ranges := func() []string {
		rs, err := veth.RangeRoutes()
		errs = append(errs, err)
		var out []string
		for _, r := range rs {
			out = append(out, "unreachable route "+r.String())
		}
		return out
	}
	before := append(sets(), ranges()...)
	errs = append(errs, Release(n))
	after := append(sets(), ranges()...)
	for _, b := range before {
		if !slices.Contains(after, b) {
			done = append(done, b)
		}
	}
	return done, errors.Join(errs...)
}
