package agent

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"unique"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy/compile"
)

// podRecord is what the agent keeps of a pod of the cluster in its
// informer's cache: what the compiler reads (its namespace, name, uid,
// labels, addresses, phase, host network and named container ports) and
// no more. Every node's agent keeps one of every pod: as a *corev1.Pod,
// even emptied of the rest, one takes about 2 KB (the struct alone is
// 1.2 KB); a record about 300 bytes, its namespace, labels and port names
// shared between the pods that have the same (unique.Handle).
type podRecord struct {
	namespace   unique.Handle[string]
	name, uid   string
	rv          string
	labels      []unique.Handle[string] // key, value, key, value..., sorted by key
	ips         []string                // status.podIPs, or status.podIP
	ports       []portRecord            // of containers and init containers, in order
	phase       unique.Handle[string]
	hostNetwork bool
}

// portRecord is a container port: what a named port resolves to.
type portRecord struct {
	name, protocol unique.Handle[string]
	port           int32
}

var (
	_ runtime.Object            = (*podRecord)(nil)
	_ metav1.ObjectMetaAccessor = (*podRecord)(nil)
)

// recordOf makes the record of pod p.
func recordOf(p *corev1.Pod) *podRecord {
	r := &podRecord{namespace: unique.Make(p.Namespace), name: p.Name, uid: string(p.UID), rv: p.ResourceVersion,
		phase: unique.Make(string(p.Status.Phase)), hostNetwork: p.Spec.HostNetwork}
	if len(p.Labels) > 0 {
		keys := make([]string, 0, len(p.Labels))
		for k := range p.Labels {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		r.labels = make([]unique.Handle[string], 0, 2*len(keys))
		for _, k := range keys {
			r.labels = append(r.labels, unique.Make(k), unique.Make(p.Labels[k]))
		}
	}
	for _, ip := range p.Status.PodIPs {
		r.ips = append(r.ips, ip.IP)
	}
	if len(r.ips) == 0 && p.Status.PodIP != "" {
		r.ips = []string{p.Status.PodIP}
	}
	for _, cs := range [][]corev1.Container{p.Spec.Containers, p.Spec.InitContainers} {
		for _, c := range cs {
			for _, cp := range c.Ports {
				r.ports = append(r.ports, portRecord{name: unique.Make(cp.Name), protocol: unique.Make(string(cp.Protocol)), port: cp.ContainerPort})
			}
		}
	}
	return r
}

// pod is the record as the compiler reads a pod: its container ports in
// one container (the compiler resolves named ports over all of them).
func (r *podRecord) pod() *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: r.namespace.Value(), Name: r.name, UID: types.UID(r.uid), ResourceVersion: r.rv}}
	if len(r.labels) > 0 {
		p.Labels = make(map[string]string, len(r.labels)/2)
		for i := 0; i+1 < len(r.labels); i += 2 {
			p.Labels[r.labels[i].Value()] = r.labels[i+1].Value()
		}
	}
	p.Spec.HostNetwork = r.hostNetwork
	p.Status.Phase = corev1.PodPhase(r.phase.Value())
	for _, ip := range r.ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	if len(r.ports) > 0 {
		c := corev1.Container{Name: "ports"}
		for _, cp := range r.ports {
			c.Ports = append(c.Ports, corev1.ContainerPort{Name: cp.name.Value(), Protocol: corev1.Protocol(cp.protocol.Value()), ContainerPort: cp.port})
		}
		p.Spec.Containers = []corev1.Container{c}
	}
	return p
}

// sameFacts: the two records differ in nothing the compiler reads (an
// update of a condition, an annotation, the resource version only).
func (r *podRecord) sameFacts(o *podRecord) bool {
	return r.namespace == o.namespace && r.name == o.name && r.uid == o.uid && r.phase == o.phase && r.hostNetwork == o.hostNetwork &&
		slices.Equal(r.labels, o.labels) && slices.Equal(r.ips, o.ips) && slices.Equal(r.ports, o.ports)
}

// GetObjectKind: a record has no kind (the informer's cache does not ask).
func (r *podRecord) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject copies the record (its slices; the handles are values).
func (r *podRecord) DeepCopyObject() runtime.Object {
	c := *r
	c.labels, c.ips, c.ports = slices.Clone(r.labels), slices.Clone(r.ips), slices.Clone(r.ports)
	return &c
}

// GetObjectMeta is what the informer's cache keys and indexes the record
// by: its namespace and name (and resource version).
func (r *podRecord) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: r.namespace.Value(), Name: r.name, UID: types.UID(r.uid), ResourceVersion: r.rv}
}

// podIndex is the pods' informer cache: records by namespace.
type podIndex struct{ cache.Indexer }

// all is every record.
func (x podIndex) all() []*podRecord { return records(x.List()) }

// of is the records of namespace ns.
func (x podIndex) of(ns string) ([]*podRecord, error) {
	objs, err := x.ByIndex(cache.NamespaceIndex, ns)
	return records(objs), err
}

func records(objs []any) []*podRecord {
	out := make([]*podRecord, 0, len(objs))
	for _, o := range objs {
		if r, ok := o.(*podRecord); ok {
			out = append(out, r)
		}
	}
	return out
}

// scopedPods are the pods the compiler was given: those of the namespaces
// of the scope, by namespace/name, as the records they were made of (a
// record is replaced, not changed, by an update).
type scopedPods struct {
	recs map[string]*podRecord
	nss  map[string]bool // the scope's namespaces
	all  bool            // every namespace
}

// update brings the pods to those of the namespaces nss (all: of every
// namespace) and returns what changed, as the compiler's pods (nil:
// gone). With the same namespaces, only the pods of dirty (changed since
// the last update) are read; a scope that changed, or relist, lists every
// pod of the scope and compares it with the records.
func (s *scopedPods) update(x podIndex, nss map[string]bool, all bool, dirty map[string]bool, relist bool) (map[string]*corev1.Pod, error) {
	changes := map[string]*corev1.Pod{}
	set := func(key string, r *podRecord) {
		old, had := s.recs[key]
		switch {
		case r == nil && had:
			delete(s.recs, key)
			changes[key] = nil
		case r != nil && old != r:
			s.recs[key] = r
			if old == nil || !old.sameFacts(r) { // not a condition's update
				changes[key] = r.pod()
			}
		}
	}
	if s.recs == nil {
		s.recs = map[string]*podRecord{}
	}
	if relist || all != s.all || !maps.Equal(nss, s.nss) {
		var rs []*podRecord
		if all {
			rs = x.all()
		} else {
			for ns := range nss {
				of, err := x.of(ns)
				if err != nil {
					return nil, err
				}
				rs = append(rs, of...)
			}
		}
		seen := make(map[string]bool, len(rs))
		for _, r := range rs {
			key := r.namespace.Value() + "/" + r.name
			seen[key] = true
			set(key, r)
		}
		for key := range s.recs {
			if !seen[key] {
				set(key, nil)
			}
		}
		s.nss, s.all = nss, all
		return changes, nil
	}
	for key := range dirty {
		ns, _, _ := cache.SplitMetaNamespaceKey(key)
		if !all && !nss[ns] {
			continue
		}
		obj, ok, err := x.GetByKey(key)
		if err != nil {
			return nil, err
		}
		r, _ := obj.(*podRecord)
		if !ok {
			r = nil
		}
		set(key, r)
	}
	return changes, nil
}

// policyRecord is what the agent keeps of a NetworkPolicy of the cluster:
// its namespace's fact, and its spec as protobuf, decoded only when a pod
// of its namespace is on this node (policyObjects). Every agent keeps
// every policy: a decoded one takes about 2 KB, a record a few hundred
// bytes.
type policyRecord struct {
	namespace unique.Handle[string]
	name, uid string
	rv        string
	fact      policy.NamespaceFact
	spec      []byte
}

var (
	_ runtime.Object            = (*policyRecord)(nil)
	_ metav1.ObjectMetaAccessor = (*policyRecord)(nil)
)

// policyRecordOf makes the record of p.
func policyRecordOf(p *networkingv1.NetworkPolicy) (*policyRecord, error) {
	spec, err := p.Spec.Marshal()
	if err != nil {
		return nil, fmt.Errorf("network policy %s/%s: %w", p.Namespace, p.Name, err)
	}
	return &policyRecord{namespace: unique.Make(p.Namespace), name: p.Name, uid: string(p.UID), rv: p.ResourceVersion,
		fact: compile.FactOf(p), spec: spec}, nil
}

// policy decodes the record.
func (r *policyRecord) policy() (*networkingv1.NetworkPolicy, error) {
	p := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: r.namespace.Value(), Name: r.name, UID: types.UID(r.uid), ResourceVersion: r.rv}}
	if err := p.Spec.Unmarshal(r.spec); err != nil {
		return nil, fmt.Errorf("network policy %s/%s: %w", p.Namespace, p.Name, err)
	}
	return p, nil
}

// sameSpec: an update that changes the spec (the protobuf encoding is
// deterministic: map keys sorted).
func (r *policyRecord) sameSpec(o *policyRecord) bool { return bytes.Equal(r.spec, o.spec) }

// GetObjectKind: a record has no kind.
func (r *policyRecord) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject copies the record.
func (r *policyRecord) DeepCopyObject() runtime.Object {
	c := *r
	c.spec = slices.Clone(r.spec)
	return &c
}

// GetObjectMeta is what the informer's cache keys and indexes it by.
func (r *policyRecord) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: r.namespace.Value(), Name: r.name, UID: types.UID(r.uid), ResourceVersion: r.rv}
}

// policyIndex is the policies' informer cache: records by namespace.
type policyIndex struct{ cache.Indexer }

func policyRecords(objs []any) []*policyRecord {
	out := make([]*policyRecord, 0, len(objs))
	for _, o := range objs {
		if r, ok := o.(*policyRecord); ok {
			out = append(out, r)
		}
	}
	return out
}

// all is every record.
func (x policyIndex) all() []*policyRecord { return policyRecords(x.List()) }

// of is the records of namespace ns.
func (x policyIndex) of(ns string) ([]*policyRecord, error) {
	objs, err := x.ByIndex(cache.NamespaceIndex, ns)
	return policyRecords(objs), err
}

// policyObjects decodes records for the compiler, keeping the object made
// for a record the last time (the compiler keeps a policy's parsed form
// while it is the same object).
type policyObjects struct {
	last map[*policyRecord]*networkingv1.NetworkPolicy
}

func (po *policyObjects) policies(rs []*policyRecord) ([]*networkingv1.NetworkPolicy, error) {
	next := make(map[*policyRecord]*networkingv1.NetworkPolicy, len(rs))
	out := make([]*networkingv1.NetworkPolicy, 0, len(rs))
	for _, r := range rs {
		p := po.last[r]
		if p == nil {
			var err error
			if p, err = r.policy(); err != nil {
				return nil, err
			}
		}
		next[r] = p
		out = append(out, p)
	}
	po.last = next
	return out, nil
}
