// Package feature is the shape every capability of the datapath takes
// beyond the core of a call (IPAM, the veth pair with its addresses and
// routes, the endpoint record): it reads its own configuration keys, sets
// itself up for one endpoint with its own undo steps, takes itself down,
// checks itself, collects its garbage, leaves the node with the last
// endpoint, and shows itself in the operator CLI. The verbs (pkg/plugin)
// are the core steps and a loop over the registered features
// (pkg/features); they name none of them.
package feature

import (
	"encoding/json"
	"errors"
	"net"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/config"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

// Feature is one capability, registered once (pkg/features). ADD runs the
// features in registration order, DEL in reverse.
type Feature interface {
	// Name keys the feature's state in endpoint records and names it in
	// messages ("hostPort").
	Name() string
	// Programs are the program objects it needs loaded (with every other
	// feature's, under one tag).
	Programs() []programs.Object
	// Parse reads the feature's keys from the network configuration of an
	// ADD or CHECK (conf is stdin: top-level keys and runtimeConfig). A bad
	// key is a *config.Error that names it. DEL, GC and STATUS do not parse:
	// they work from what ADD recorded, whatever the configuration says now.
	Parse(conf []byte) (Pod, error)
	// Del removes what Add made for the endpoint, found through its record
	// (ep.Record; without one, only HostIfName and what the host veth
	// tells). Idempotent: what is gone already is success.
	Del(n *node.Node, ep *Endpoint) error
	// GC removes what the feature keeps for endpoints that are not live,
	// and its expired state; with dryRun it only lists what it would
	// remove (one line each). The node lock is held exclusively.
	GC(n *node.Node, live *Live, dryRun bool) ([]string, error)
	// Release takes the feature's node-wide state away (programs on
	// devices and cgroups, node settings) once the node has no endpoint
	// left. The node lock is held exclusively. Idempotent.
	Release(n *node.Node) error
	// Repair mends what the feature keeps for rp.Endpoint, or the node,
	// as rp says, and names what was missing, one line each, as far as it
	// can tell (a dry run: what is). Idempotent; the node lock is held,
	// and the endpoint's attachment lock.
	Repair(n *node.Node, rp *Repair) ([]string, error)
	// Commands are the feature's operator CLI commands.
	Commands() []*view.Command
	// Columns are what the CLI's endpoints command shows of every
	// endpoint for the feature (nil: nothing).
	Columns() *view.Columns
}

// Repair is what the repair layer (pkg/repair) asks of a feature: to mend
// what it keeps for one live endpoint, or for the node, from whichever
// side still holds it: a record rebuilt from the kernel (its stateDir
// file lost) learns the feature's state from its maps; maps and links a
// bpffs loss took are written again from the record.
type Repair struct {
	// Endpoint is the live endpoint to mend (ep.Host its host veth); nil:
	// the feature's node-wide state (the records of its attachments
	// outside host veths, lost with the stateDir).
	Endpoint *Endpoint
	// Rebuilt: the endpoint's record was rebuilt from the kernel in this
	// repair; the feature puts in it what its maps tell (and, with Pod,
	// what the network's configuration does).
	Rebuilt bool
	// Pod is the feature configured from the calling network (a CNI
	// STATUS or ADD; no runtimeConfig) when the endpoint is of that
	// network; nil otherwise.
	Pod Pod
	// DryRun: change nothing on the node, only say what is missing (the
	// operator's status).
	DryRun bool
}

// Pod is a feature configured for one call.
type Pod interface {
	// Needs is what the feature needs of the core's part of the endpoint,
	// known before anything is made.
	Needs() Needs
	// Add sets the feature up for the endpoint: per-endpoint state, and
	// node-wide state it needs (idempotently). Every step it takes goes on
	// undo, which runs, last first, if the ADD fails later. Its state for
	// DEL goes into the record (ep.SetFeature).
	Add(n *node.Node, ep *Endpoint, undo *Undo) error
	// Check names every difference between what the configuration asks and
	// what the node has for the endpoint.
	Check(n *node.Node, ep *Endpoint) []string
}

// Needs are a feature's demands on the core steps of an ADD, gathered
// from every feature before the veth is made.
type Needs struct {
	// Flags are endpoint flags (enum endpoint_flags) the programs must see
	// for the pod; the core's endpoint step writes them with its entries (in
	// ep.Flags before any Add runs).
	Flags maps.CniEndpointFlags
	// Overhead is what the feature's encapsulation takes off the pod's MTU
	// when the configuration names none (the largest of all applies).
	Overhead int
}

// Endpoint is the attachment a call is about, as the features see it.
type Endpoint struct {
	// Record is the endpoint record: what identifies the endpoint, its
	// addresses, the host veth's attachments, each feature's state. ADD
	// fills it in and writes it last; DEL and CHECK read it (DEL without a
	// record: only HostIfName, and what features find on the node).
	*node.Record
	// Recorded: the record was there (DEL, CHECK); without it only
	// HostIfName is known, and what features find on the node.
	Recorded bool
	// Mode is the call's attachMode for the host veth (ADD), DeviceMode
	// for the node's devices a feature attaches to (uplinks, the overlay).
	Mode, DeviceMode attach.Mode
	// PodNS is the pod's network namespace (ADD, CHECK).
	PodNS ns.NetNS
	// Host is the host veth (ADD, CHECK; nil when it is gone).
	Host netlink.Link
	// Flags are the endpoint flags every feature's Pod needs (ADD).
	Flags maps.CniEndpointFlags
}

// Base gives a feature the methods it does not need, doing nothing.
type Base struct{}

func (Base) Programs() []programs.Object                  { return nil }
func (Base) Del(*node.Node, *Endpoint) error              { return nil }
func (Base) GC(*node.Node, *Live, bool) ([]string, error) { return nil, nil }
func (Base) Release(*node.Node) error                     { return nil }
func (Base) Repair(*node.Node, *Repair) ([]string, error) { return nil, nil }
func (Base) Commands() []*view.Command                    { return nil }
func (Base) Columns() *view.Columns                       { return nil }

// Undo is the steps an ADD has taken, to reverse them if it fails.
type Undo struct{ steps []func() error }

// Push adds the step that reverses what was just done.
func (u *Undo) Push(step func() error) { u.steps = append(u.steps, step) }

// Run runs every step, last first, even if one fails.
func (u *Undo) Run() error {
	var errs []error
	for i := len(u.steps) - 1; i >= 0; i-- {
		errs = append(errs, u.steps[i]())
	}
	u.steps = nil
	return errors.Join(errs...)
}

// Live is what GC keeps: the endpoints that stay, by host veth.
type Live struct {
	Records map[string]*node.Record
	ifindex map[int]bool
	ips     map[string]bool
	nets    map[uint32]bool
}

// NewLive indexes the endpoints that stay. One whose network is not known
// (the operator's gc keeps an endpoint without a record if its veth lives)
// keeps every network.
func NewLive(recs map[string]*node.Record) *Live {
	l := &Live{Records: recs, ifindex: map[int]bool{}, ips: map[string]bool{}, nets: map[uint32]bool{}}
	for _, r := range recs {
		l.ifindex[r.HostIfIndex] = true
		if r.Network == "" {
			l.nets = nil
		} else if l.nets != nil {
			l.nets[maps.NetID(r.Network)] = true
		}
		for _, ip := range r.Addrs() {
			l.ips[ip.String()] = true
		}
	}
	return l
}

// Empty reports whether no endpoint stays.
func (l *Live) Empty() bool { return len(l.Records) == 0 }

// IfIndex reports whether the host veth ifindex is a live endpoint's.
func (l *Live) IfIndex(i int) bool { return l.ifindex[i] }

// IP reports whether ip is a live endpoint's address.
func (l *Live) IP(ip net.IP) bool { return l.ips[ip.String()] }

// Network reports whether a live endpoint is in the network of NetID id.
func (l *Live) Network(id uint32) bool { return l.nets == nil || l.nets[id] }

// Host reports whether the host veth name is a live endpoint's.
func (l *Live) Host(name string) bool { return l.Records[name] != nil }

// Fail is a failed step of a feature as the CNI reports it: a bad key (a
// *config.Error in err) is code 7, a CNI error made already passes through,
// anything else gets the feature's code (pkg/errcode) and says what failed.
func Fail(code uint, what string, err error) error {
	if err == nil {
		return nil
	}
	if ce, ok := config.AsCNI(err); ok {
		return ce
	}
	var te *types.Error
	if errors.As(err, &te) {
		return te
	}
	return types.NewError(code, what+": "+err.Error(), err.Error())
}

// Decode reads the network configuration into v (the feature's keys); a
// malformed one is the CNI's decoding failure.
func Decode(conf []byte, v any) error {
	if err := json.Unmarshal(conf, v); err != nil {
		return types.NewError(types.ErrDecodingFailure, "decoding network configuration", err.Error())
	}
	return nil
}

// Sweep collects what a GC finds, one line each, and removes it unless it
// is a dry run.
type Sweep struct {
	DryRun bool
	found  []string
	errs   []error
}

// Remove notes what and, unless DryRun, runs del.
func (s *Sweep) Remove(what string, del func() error) {
	s.found = append(s.found, what)
	if !s.DryRun {
		s.errs = append(s.errs, del())
	}
}

// Result is what was found, and what failed to go.
func (s *Sweep) Result() ([]string, error) { return s.found, errors.Join(s.errs...) }
