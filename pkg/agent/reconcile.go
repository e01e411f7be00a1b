package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
)

// Reconciler keeps a NodeRoutes in line with the Node objects it reads
// (from the informer's cache: it never asks the API server itself).
// SyncNode handles one node's event; SyncAll compares everything the
// NodeRoutes lists with every node, and removes what no node accounts for
// (nodes deleted while the agent was not watching). Not safe for
// concurrent calls: the agent runs it from one worker.
type Reconciler struct {
	self   string
	routes NodeRoutes
	nodes  corelisters.NodeLister
	log    *slog.Logger

	// owned is what Ensure applied per peer, so a node's deletion or a
	// change of its ranges withdraws exactly its old entries.
	owned map[string][]Route
	// selfCIDRs are this node's ranges: no peer's entry may cover them.
	selfCIDRs []netip.Prefix
	selfSeen  bool

	mu       sync.Mutex // guards what Status reads
	problems map[string]string
	entries  int   // entries installed
	peers    int   // nodes with entries
	synced   bool  // a SyncAll ran
	syncErr  error // what the last SyncAll could not do
	syncEnd  time.Time
	present  int // owned entries the last SyncAll found installed
}

// NewReconciler reconciles routes for node self from the lister's nodes.
func NewReconciler(self string, routes NodeRoutes, nodes corelisters.NodeLister, log *slog.Logger) *Reconciler {
	return &Reconciler{self: self, routes: routes, nodes: nodes, log: log, owned: map[string][]Route{}, problems: map[string]string{}}
}

// errConfig marks problems only a change of a Node object can fix: the
// agent reports them but does not retry.
type errConfig struct{ error }

func (e errConfig) Unwrap() error { return e.error }

// IsConfigProblem reports whether err comes from a Node object's content
// (no retry helps) rather than from applying entries (retried).
func IsConfigProblem(err error) bool {
	var c errConfig
	return errors.As(err, &c)
}

// SyncNode brings the entries of one node in line with its Node object:
// installs what it needs, withdraws what it no longer needs, and all of it
// when the Node is gone.
func (r *Reconciler) SyncNode(name string) error {
	n, err := r.nodes.Get(name)
	switch {
	case apierrors.IsNotFound(err):
		n = nil
	case err != nil:
		return fmt.Errorf("reading node %s from the cache: %w", name, err)
	}
	if name == r.self {
		r.readSelf(n)
		return nil
	}
	var want []Route
	var problems []error
	if n != nil {
		peer, err := PeerOf(n)
		if err != nil {
			problems = append(problems, err)
		}
		planned, err := r.routes.Plan(peer)
		if err != nil {
			problems = append(problems, err)
		}
		for _, rt := range planned {
			if own := r.overlapsSelf(rt.Dst); own.IsValid() {
				problems = append(problems, fmt.Errorf("node %s claims %s, which overlaps this node's pod range %s: not routed", name, rt.Dst, own))
				continue
			}
			want = append(want, rt)
		}
	}
	var failed []error
	for _, rt := range want {
		if err := r.routes.Ensure(rt); err != nil {
			failed = append(failed, err)
		} else if !slices.Contains(r.owned[name], rt) {
			r.log.Info("route added", "node", name, "route", rt.String(), "mode", r.routes.Mode())
		}
	}
	keep := slices.Clone(want)
	for _, old := range r.owned[name] {
		if slices.Contains(want, old) {
			continue
		}
		if err := r.routes.Remove(old); err != nil {
			failed = append(failed, err)
			keep = append(keep, old) // withdrawn at the next try
			continue
		}
		r.log.Info("route removed", "node", name, "route", old.String(), "nodeGone", n == nil)
	}
	if len(keep) == 0 {
		delete(r.owned, name)
	} else {
		r.owned[name] = keep
	}
	err = errors.Join(errors.Join(problems...), errors.Join(failed...))
	r.setProblem(name, err)
	r.publish()
	switch {
	case len(failed) > 0:
		return err
	case err != nil:
		return errConfig{err}
	}
	return nil
}

// publish makes the counts Status shows current.
func (r *Reconciler) publish() {
	n := 0
	for _, list := range r.owned {
		n += len(list)
	}
	r.mu.Lock()
	r.peers, r.entries = len(r.owned), n
	r.mu.Unlock()
}

func (r *Reconciler) readSelf(n *corev1.Node) {
	r.selfCIDRs, r.selfSeen = nil, n != nil
	if n == nil {
		r.setProblem(r.self, fmt.Errorf("this node (%s) has no Node object", r.self))
		return
	}
	p, err := PeerOf(n)
	r.selfCIDRs = p.PodCIDRs
	if err == nil && len(p.PodCIDRs) == 0 {
		err = fmt.Errorf("this node (%s) has no spec.podCIDRs: give the cluster a pod range to allocate from (kube-controller-manager --allocate-node-cidrs --cluster-cidr)", r.self)
	}
	r.setProblem(r.self, err)
}

func (r *Reconciler) overlapsSelf(p netip.Prefix) netip.Prefix {
	for _, own := range r.selfCIDRs {
		if own.Overlaps(p) {
			return own
		}
	}
	return netip.Prefix{}
}

// SyncAll reconciles every node and removes the entries that no node
// accounts for. It returns the first error after trying everything.
func (r *Reconciler) SyncAll() error {
	nodes, err := r.nodes.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("listing nodes from the cache: %w", err)
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	var self *corev1.Node
	for _, n := range nodes {
		if n.Name == r.self {
			self = n
		}
	}
	r.readSelf(self) // first: peers are checked against this node's ranges
	present := map[string]bool{}
	var errs []error
	for _, n := range nodes {
		present[n.Name] = true
		if n.Name == r.self {
			continue
		}
		if err := r.SyncNode(n.Name); err != nil && !IsConfigProblem(err) {
			errs = append(errs, err)
		}
	}
	// Nodes deleted since the last look: their delete events may have come
	// as tombstones or not at all (agent down, API server restarted).
	for name := range r.owned {
		if !present[name] {
			if err := r.SyncNode(name); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for name := range r.problemNames() {
		if !present[name] && name != r.self {
			r.setProblem(name, nil)
		}
	}
	// Entries nobody owns: installed by an earlier run of the agent for a
	// node that no longer exists, or for a range a node no longer has.
	installed, err := r.routes.List()
	if err != nil {
		errs = append(errs, err)
	}
	found := 0
	for _, rt := range installed {
		if r.isOwned(rt) {
			found++
			continue
		}
		if err := r.routes.Remove(rt); err != nil {
			errs = append(errs, err)
			continue
		}
		r.log.Info("stale route removed", "route", rt.String())
	}
	r.publish()
	err = errors.Join(errs...)
	r.mu.Lock()
	r.synced, r.syncErr, r.syncEnd, r.present = true, err, time.Now(), found
	r.mu.Unlock()
	return err
}

func (r *Reconciler) isOwned(rt Route) bool {
	for _, list := range r.owned {
		if slices.Contains(list, rt) {
			return true
		}
	}
	return false
}

func (r *Reconciler) setProblem(name string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		delete(r.problems, name)
		return
	}
	r.problems[name] = err.Error()
}

func (r *Reconciler) problemNames() map[string]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]bool{}
	for n := range r.problems {
		out[n] = true
	}
	return out
}

// state fills in what Status reports of the reconciler.
// lastSync is when the last SyncAll ended and how many of the entries it
// owns it found installed.
func (r *Reconciler) lastSync() (time.Time, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.syncEnd, r.present
}

func (r *Reconciler) state(s *Status) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s.Peers, s.Routes = r.peers, r.entries
	for _, p := range r.problems {
		s.Problems = append(s.Problems, p)
	}
	sort.Strings(s.Problems)
	switch {
	case !r.synced:
		s.Reason = "the first full sync has not run"
	case r.syncErr != nil:
		s.Reason = "the last full sync failed: " + r.syncErr.Error()
	case len(s.Problems) > 0:
		s.Reason = "problems with some nodes"
	}
}
