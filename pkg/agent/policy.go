package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"
	cnpinformers "sigs.k8s.io/network-policy-api/pkg/client/informers/externalversions"
	cnplisters "sigs.k8s.io/network-policy-api/pkg/client/listers/apis/v1beta1"

	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	nodestate "github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy/compile"
)

// PolicyConfig is how the NetworkPolicy controller runs.
type PolicyConfig struct {
	// Node is the agent's handle on the plugin's node: the policy and
	// endpoint maps, opened anew (Reopen) at each start.
	Node *nodestate.Node
	// Poll is how often endpoint_pods and endpoint_devs are read for
	// endpoints that came or went (ADD and DEL tell nobody). Default 250 ms.
	Poll time.Duration
	// ClusterPolicies is the client of ClusterNetworkPolicies
	// (policy.networking.k8s.io/v1beta1); nil: NetworkPolicies only.
	ClusterPolicies cnpclient.Interface
	// ClusterPoliciesCheck is how often the controller asks the API
	// server whether it serves ClusterNetworkPolicies (their CRD
	// installed or removed). Default 30 s.
	ClusterPoliciesCheck time.Duration
	Logger               *slog.Logger
}

// DefaultPolicyPoll is PolicyConfig.Poll's default.
const DefaultPolicyPoll = 250 * time.Millisecond

// DefaultClusterPoliciesCheck is PolicyConfig.ClusterPoliciesCheck's default.
const DefaultClusterPoliciesCheck = 30 * time.Second

// errCNPChanged ends a start when the API server starts or stops serving
// ClusterNetworkPolicies: the next start watches them or not. Not a
// failure: the maps stay as written meanwhile.
var errCNPChanged = errors.New("the API server's ClusterNetworkPolicy resource came or went")

// policyResync: a full comparison of the maps with the policies even when
// nothing changed (a write that failed, an entry someone removed).
const policyResync = time.Minute

// policyLatencies is how many of the last latencies Latencies keeps.
const policyLatencies = 10000

// The wait between two starts of a controller that cannot start (bpfRoot
// not on a bpffs yet, maps that cannot be opened or read) doubles from
// policyRetry to policyRetryMax: a mount that appears is seen within 30 s,
// and a cause that stays costs a log line every 30 s.
const (
	policyRetry    = time.Second
	policyRetryMax = 30 * time.Second
)

// PolicyController compiles the cluster's NetworkPolicies for the endpoints
// of this node into the policy maps (pkg/policy) and keeps them current.
// The maps are the datapath's only input: they stay as written while the
// controller is down.
type PolicyController struct {
	cfg    PolicyConfig
	client kubernetes.Interface
	log    *slog.Logger

	// Opened by each start, closed when it ends; touched by the worker only.
	nd   *nodestate.Node // this start's handle: the maps below are its
	pm   *policy.Maps
	devs *ebpf.Map // endpoint_devs
	pods *ebpf.Map // endpoint_pods

	// Touched by the worker only.
	compiler compile.Compiler
	scoped   scopedPods                                                   // the compiler's pods: those of the scope
	polObjs  policyObjects                                                // and its policies, decoded from theirs
	written  map[uint32]writtenEndpoint                                   // what each endpoint's last write wrote, done
	rules    map[uint32]map[policy.Direction]map[netip.Prefix]policy.Rule // what policy_rules holds
	gens     map[uint32][2]uint32                                         // the last generation written, by ifindex and direction
	facts    map[string]policy.NamespaceFact                              // what policy_namespaces holds
	want     map[string]policy.NamespaceFact                              // the facts of the namespaces with policies
	cnpFacts map[string]policy.NamespaceFact                              // the last compilation's, where ClusterNetworkPolicies exist
	// clusterPolicies is how many ClusterNetworkPolicies the last
	// compilation read.
	clusterPolicies int
	names           map[uint32]policy.Source // what policy_sources holds
	errs            map[uint32]string        // the compile error last reported, by endpoint

	mu      sync.Mutex
	running bool   // its maps are open: it watches and writes
	cnp     bool   // it watches ClusterNetworkPolicies (the API server serves them)
	problem string // why the last start failed, while it is retried
	retries int    // starts failed since it last ran
	synced  bool
	pending time.Time // the first change not written yet
	// What the changes since the last sync need: a compilation, the facts
	// of some namespaces, or of all (a start, the resync, a failed sync).
	needCompile bool
	dirtyNS     map[string]bool
	allNS       bool
	// dirtyPods are the pods of the scope that changed (namespace/name);
	// relist: every pod of the scope is compared with the records (a
	// start, the resync, a failed sync).
	dirtyPods map[string]bool
	relist    bool
	lats      []time.Duration
	latNext   int
	hist      latencyHist
	enforced  int
	errors    uint64

	// scope is what the last compilation read (nil: none yet, everything
	// matters): the event handlers skip what cannot change this node's
	// maps.
	scope atomic.Pointer[policyScope]
}

// policyScope is what a compilation of this node's endpoints reads: the
// policies of their namespaces (local), and the pods of those and of the
// namespaces their peers can select (pods; all: every pod). A policy of
// another namespace changes only that namespace's fact; a pod of another
// namespace changes nothing.
type policyScope struct {
	local   map[string]bool
	pods    map[string]bool
	allPods bool
}

func (s *policyScope) policyMatters(ns string) bool { return s == nil || s.local[ns] }
func (s *policyScope) podMatters(ns string) bool {
	return s == nil || s.allPods || s.local[ns] || s.pods[ns]
}

// latencyHist is a Prometheus histogram's counts.
type latencyHist struct {
	counts []uint64 // by policyLatencyBuckets, not cumulative
	count  uint64
	sum    float64
}

// policyLatencyBuckets: from a change to the maps written, 1 ms to 10 s.
var policyLatencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// NewPolicyController prepares a controller of the maps of cfg.Node; Run
// opens them (creating the policy maps when no plugin call
// has yet) and starts it.
func NewPolicyController(client kubernetes.Interface, cfg PolicyConfig) *PolicyController {
	if cfg.Poll <= 0 {
		cfg.Poll = DefaultPolicyPoll
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ClusterPoliciesCheck <= 0 {
		cfg.ClusterPoliciesCheck = DefaultClusterPoliciesCheck
	}
	return &PolicyController{cfg: cfg, client: client, log: cfg.Logger,
		hist: latencyHist{counts: make([]uint64, len(policyLatencyBuckets))}}
}

// open opens the node's maps for one start, through a handle of its own
// (closed with the start): a bpffs remounted since the last start is seen.
func (c *PolicyController) open() error {
	nd := c.cfg.Node.Reopen()
	if err := nd.CheckBPFFS(); err != nil {
		return fmt.Errorf("opening the plugin's policy maps (bpfRoot %s): %w", nd.BPFRoot(), err)
	}
	pm, err := policy.Open(nd)
	if err != nil {
		nd.Close()
		return fmt.Errorf("opening the plugin's policy maps (bpfRoot %s): %w", nd.BPFRoot(), err)
	}
	devs, err := nd.Map(maps.CniMapEndpointDevs)
	var pods *ebpf.Map
	if err == nil {
		pods, err = nd.Map(maps.CniMapEndpointPods)
	}
	if err != nil {
		nd.Close()
		return fmt.Errorf("opening the plugin's endpoint maps (bpfRoot %s): %w", nd.BPFRoot(), err)
	}
	c.nd, c.pm, c.devs, c.pods = nd, pm, devs, pods
	return nil
}

// policyKey is the one key of the queue: every change leads to one
// recompile, bursts to one.
const policyKey = "policies"

// Run runs the controller until ctx ends, then closes the maps (the pinned
// maps stay as written) and returns ctx's error. What keeps it from
// starting (bpfRoot not on a bpffs, a map that cannot be opened or read) is
// logged, reported (Status, the metrics) and retried, from 1 s doubling to
// 30 s: the network policies are one job of the agent, and their failure
// must not stop the others (the routes); they start once the cause is gone.
func (c *PolicyController) Run(ctx context.Context) error {
	delay := policyRetry
	for {
		err := c.run(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, errCNPChanged) {
			continue
		}
		if err == nil { // run returns only with an error or when ctx ends
			err = errors.New("the controller stopped")
		}
		c.mu.Lock()
		c.running, c.problem = false, err.Error()
		c.retries++
		retries := c.retries
		c.mu.Unlock()
		c.log.Warn("network policies not enforced: the controller cannot start, retrying", "err", err, "retryIn", delay, "failedStarts", retries)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, policyRetryMax)
	}
}

// run is one start: the maps opened, the informers synced, the maps read,
// then the worker until ctx ends.
func (c *PolicyController) run(ctx context.Context) error {
	if err := c.open(); err != nil {
		return err
	}
	defer c.close()
	served, err := c.cnpServed()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c.mu.Lock()
	c.running, c.problem, c.cnp = true, "", served
	retries := c.retries
	c.retries = 0
	c.mu.Unlock()
	if retries > 0 {
		c.log.Info("network policies: the maps are open, starting", "failedStarts", retries)
	}
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, 10*time.Second))
	defer queue.ShutDown()
	changed := c.changedFunc(queue)
	c.scope.Store(nil)
	factory, l, synced, err := c.watch(changed)
	if err != nil {
		return err
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if served {
		cf, lister, informerSynced, err := c.watchCNP(changed)
		if err != nil {
			return err
		}
		cf.Start(ctx.Done())
		defer cf.Shutdown()
		l.cnps = lister
		synced = append(synced, informerSynced)
		c.log.Info("watching ClusterNetworkPolicies")
	} else if c.cfg.ClusterPolicies != nil {
		c.log.Info("the API server serves no ClusterNetworkPolicies (their CRD is not installed): NetworkPolicies only, asking again every " + c.cfg.ClusterPoliciesCheck.String())
	}
	cnpChanged := make(chan struct{})
	if c.cfg.ClusterPolicies != nil {
		go func() {
			if c.watchServed(ctx, served) {
				close(cnpChanged)
				cancel()
			}
		}()
	}
	c.log.Info("waiting for the network policies, pods and namespaces")
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return ctx.Err()
	}
	if err := c.load(); err != nil {
		return err
	}
	changed(true, "", true)
	eps, err := c.endpoints()
	if err != nil {
		return err
	}
	polled := make(chan struct{})
	go func() { c.poll(ctx, queue, changed, fmt.Sprint(eps)); close(polled) }()
	defer func() { <-polled }() // before the maps it reads are closed
	c.work(queue, l)
	select {
	case <-cnpChanged:
		return errCNPChanged
	default:
	}
	return ctx.Err()
}

// changedFunc is the handlers' changed: it records what a change needs
// (compile: a compilation; ns: that namespace's fact; all: every
// namespace's) and queues a sync.
func (c *PolicyController) changedFunc(queue workqueue.TypedRateLimitingInterface[string]) func(compile bool, ns string, all bool) {
	return func(compile bool, ns string, all bool) {
		c.mu.Lock()
		if c.pending.IsZero() {
			c.pending = time.Now()
		}
		c.needCompile = c.needCompile || compile
		c.allNS = c.allNS || all
		if ns != "" {
			if c.dirtyNS == nil {
				c.dirtyNS = map[string]bool{}
			}
			c.dirtyNS[ns] = true
		}
		c.mu.Unlock()
		queue.Add(policyKey)
	}
}

// work syncs the maps for each queued change until the queue shuts down,
// a failed sync retried with backoff.
func (c *PolicyController) work(queue workqueue.TypedRateLimitingInterface[string], l policyListers) {
	for {
		key, quit := queue.Get()
		if quit {
			return
		}
		if err := c.sync(l); err != nil {
			c.log.Warn("writing the network policies failed, retrying", "err", err, "retries", queue.NumRequeues(key))
			c.mu.Lock()
			c.errors++
			c.mu.Unlock()
			queue.AddRateLimited(key)
		} else {
			queue.Forget(key)
		}
		queue.Done(key)
	}
}

// watch makes the informers of policies, pods and namespaces, each change
// that matters calling changed: a policy's, the fact of its namespace and,
// in a namespace of this node's endpoints, a compilation; a pod's, in a
// namespace the last compilation read pods of, a compilation; a
// namespace's (its labels: what namespace selectors match), a
// compilation.
func (c *PolicyController) watch(changed func(compile bool, ns string, all bool)) (informers.SharedInformerFactory, policyListers, []cache.InformerSynced, error) {
	factory := informers.NewSharedInformerFactoryWithOptions(c.client, 0, informers.WithTransform(slim))
	pols := policyInformer(factory)
	pods := podInformer(factory)
	nss := factory.Core().V1().Namespaces()
	policyChanged := func(obj any) {
		ns := namespaceOf(obj)
		changed(c.scope.Load().policyMatters(ns), ns, false)
	}
	podEvent := func(obj any) {
		sc := c.scope.Load()
		if !sc.podMatters(namespaceOf(obj)) {
			return
		}
		// Without a scope (a start), the first sync lists every pod of
		// its scope: no pod to remember.
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil && sc != nil {
			c.mu.Lock()
			if c.dirtyPods == nil {
				c.dirtyPods = map[string]bool{}
			}
			c.dirtyPods[key] = true
			c.mu.Unlock()
		}
		changed(true, "", false)
	}
	nsChanged := func(any) { changed(true, "", false) }
	handler := func(on func(any), relevant func(old, cur any) bool) cache.ResourceEventHandlerFuncs {
		return cache.ResourceEventHandlerFuncs{
			AddFunc: on,
			UpdateFunc: func(old, cur any) {
				if relevant(old, cur) {
					on(cur)
				}
			},
			DeleteFunc: on,
		}
	}
	for what, h := range map[string]struct {
		inf      cache.SharedIndexInformer
		on       func(any)
		relevant func(old, cur any) bool
	}{
		"network policies": {pols, policyChanged, specChanged},
		"pods":             {pods, podEvent, podChanged},
		"namespaces":       {nss.Informer(), nsChanged, func(old, cur any) bool { return !reflect.DeepEqual(nsLabels(old), nsLabels(cur)) }},
	} {
		if _, err := h.inf.AddEventHandler(handler(h.on, h.relevant)); err != nil {
			return nil, policyListers{}, nil, fmt.Errorf("watching %s: %w", what, err)
		}
	}
	return factory, policyListers{pols: policyIndex{pols.GetIndexer()}, pods: podIndex{pods.GetIndexer()}, nss: nss.Lister()},
		[]cache.InformerSynced{pols.HasSynced, pods.HasSynced, nss.Informer().HasSynced}, nil
}

// cnpServed asks the API server whether it serves ClusterNetworkPolicies
// (policy.networking.k8s.io/v1beta1): false without a client.
func (c *PolicyController) cnpServed() (bool, error) {
	if c.cfg.ClusterPolicies == nil {
		return false, nil
	}
	l, err := c.cfg.ClusterPolicies.Discovery().ServerResourcesForGroupVersion(cnpv1.GroupVersion.String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("asking the API server for %s: %w", cnpv1.GroupVersion, err)
	}
	for _, r := range l.APIResources {
		if r.Name == "clusternetworkpolicies" {
			return true, nil
		}
	}
	return false, nil
}

// watchServed asks every cfg.ClusterPoliciesCheck whether the API server
// serves ClusterNetworkPolicies, until ctx ends or the answer is no longer
// served (true). A failed question is no answer: asked again.
func (c *PolicyController) watchServed(ctx context.Context, served bool) bool {
	t := time.NewTicker(c.cfg.ClusterPoliciesCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
		now, err := c.cnpServed()
		if err != nil {
			c.log.Debug("asking whether ClusterNetworkPolicies are served", "err", err)
			continue
		}
		if now != served {
			c.log.Info("the API server's ClusterNetworkPolicies came or went: restarting the policy controller (the maps stay as written)", "served", now)
			return true
		}
	}
}

// watchCNP makes the informer of ClusterNetworkPolicies.
// Every change of one is a compilation (it may select pods and peers in
// any namespace).
func (c *PolicyController) watchCNP(changed func(compile bool, ns string, all bool)) (cnpinformers.SharedInformerFactory, cnplisters.ClusterNetworkPolicyLister, cache.InformerSynced, error) {
	factory := cnpinformers.NewSharedInformerFactoryWithOptions(c.cfg.ClusterPolicies, 0, cnpinformers.WithTransform(slim))
	inf := factory.Policy().V1beta1().ClusterNetworkPolicies()
	on := func(any) { changed(true, "", false) }
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: on,
		UpdateFunc: func(old, cur any) {
			if !reflect.DeepEqual(cnpSpec(old), cnpSpec(cur)) {
				on(cur)
			}
		},
		DeleteFunc: on,
	}); err != nil {
		return nil, nil, nil, fmt.Errorf("watching ClusterNetworkPolicies: %w", err)
	}
	return factory, inf.Lister(), inf.Informer().HasSynced, nil
}

// cnpSpec is what the compiler reads of a ClusterNetworkPolicy (its status
// is other implementations' too).
func cnpSpec(obj any) any {
	if p, ok := obj.(*cnpv1.ClusterNetworkPolicy); ok {
		return p.Spec
	}
	return obj
}

// poll reads the endpoints every cfg.Poll (ADD and DEL tell nobody) and
// calls changed when they differ from last; it queues a full comparison
// every policyResync, and shuts the queue down when ctx ends.
func (c *PolicyController) poll(ctx context.Context, queue workqueue.TypedRateLimitingInterface[string], changed func(compile bool, ns string, all bool), last string) {
	poll := time.NewTicker(c.cfg.Poll)
	defer poll.Stop()
	resync := time.NewTicker(policyResync)
	defer resync.Stop()
	for {
		select {
		case <-ctx.Done():
			queue.ShutDown()
			return
		case <-resync.C:
			c.mu.Lock()
			c.needCompile, c.allNS, c.relist = true, true, true
			c.mu.Unlock()
			queue.Add(policyKey)
		case <-poll.C:
			eps, err := c.endpoints()
			if err != nil {
				c.log.Warn("reading the endpoints", "err", err)
				continue
			}
			if sig := fmt.Sprint(eps); sig != last {
				last = sig
				changed(true, "", false)
			}
		}
	}
}

func (c *PolicyController) close() {
	c.nd.Close() // the maps are the handle's
	c.pm, c.devs, c.pods = nil, nil, nil
}

type policyListers struct {
	cnps cnplisters.ClusterNetworkPolicyLister // nil: not served
	pols policyIndex                           // of policyRecords and podRecords: no lister reads them
	pods podIndex
	nss  listerscorev1.NamespaceLister
}

// slim keeps the informers' caches small (the agent caches every pod and
// every policy of the cluster): of a pod, its record (podRecord: what the
// compiler reads); of a policy, its record (policyRecord: its spec
// encoded); of anything else, no managed fields and no annotations.
func slim(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Pod:
		return recordOf(o), nil
	case *networkingv1.NetworkPolicy:
		return policyRecordOf(o)
	case *podRecord, *policyRecord: // a list's (listRecords)
		return o, nil
	}
	if m, ok := obj.(metav1.ObjectMetaAccessor); ok {
		// Neither is read (kubectl apply's last-applied-configuration
		// doubles a policy's size).
		m.GetObjectMeta().SetManagedFields(nil)
		m.GetObjectMeta().SetAnnotations(nil)
	}
	return obj, nil
}

// namespaceOf is the namespace of an informer's object or tombstone.
func namespaceOf(obj any) string {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		ns, _, _ := cache.SplitMetaNamespaceKey(t.Key)
		return ns
	}
	if m, err := meta.Accessor(obj); err == nil {
		return m.GetNamespace()
	}
	return ""
}

// specChanged: an update changes a policy's spec.
func specChanged(old, cur any) bool {
	o, ok1 := old.(*policyRecord)
	c, ok2 := cur.(*policyRecord)
	return !ok1 || !ok2 || !o.sameSpec(c)
}

// podChanged: an update changes something the compiler reads of a pod.
func podChanged(old, cur any) bool {
	o, ok1 := old.(*podRecord)
	c, ok2 := cur.(*podRecord)
	return !ok1 || !ok2 || !o.sameFacts(c)
}

func nsLabels(obj any) any {
	if n, ok := obj.(*corev1.Namespace); ok {
		return n.Labels
	}
	return obj
}

// load reads what the maps hold, so that a restart with the same policies
// writes nothing.
func (c *PolicyController) load() error {
	rs, err := c.pm.ReadRules()
	if err != nil {
		return err
	}
	c.rules = map[uint32]map[policy.Direction]map[netip.Prefix]policy.Rule{}
	for ifindex, byDir := range rs {
		for d, es := range byDir {
			m := c.dirRules(ifindex, d)
			for _, e := range es {
				m[e.Prefix] = e.Rule
			}
		}
	}
	states, err := c.pm.EndpointStates()
	if err != nil {
		return err
	}
	c.gens = map[uint32][2]uint32{}
	for ifindex, st := range states {
		c.gens[ifindex] = [2]uint32{st.IngressGen, st.EgressGen}
	}
	if c.facts, err = c.pm.NamespaceFacts(); err != nil {
		return err
	}
	if c.names, err = c.pm.Sources(); err != nil {
		return err
	}
	c.errs = map[uint32]string{}
	// What the compiler and the last sync kept was of the last start's
	// objects: this start compiles and compares everything anew.
	c.compiler, c.scoped, c.written = compile.Compiler{}, scopedPods{}, nil
	c.mu.Lock()
	c.relist, c.dirtyPods = true, nil
	c.mu.Unlock()
	return nil
}

func (c *PolicyController) dirRules(ifindex uint32, d policy.Direction) map[netip.Prefix]policy.Rule {
	byDir := c.rules[ifindex]
	if byDir == nil {
		byDir = map[policy.Direction]map[netip.Prefix]policy.Rule{}
		c.rules[ifindex] = byDir
	}
	m := byDir[d]
	if m == nil {
		m = map[netip.Prefix]policy.Rule{}
		byDir[d] = m
	}
	return m
}

// endpoints reads the local endpoints: endpoint_pods (who) and
// endpoint_devs (their addresses), sorted by ifindex.
func (c *PolicyController) endpoints() ([]compile.LocalEndpoint, error) {
	pods, err := endpoint.ReadPods(c.pods)
	if err != nil {
		return nil, err
	}
	out := make([]compile.LocalEndpoint, 0, len(pods))
	for ifindex, p := range pods {
		ep := compile.LocalEndpoint{Ifindex: ifindex, Namespace: p.Namespace, Name: p.Name, UID: p.UID}
		var d maps.CniEndpointDev
		if err := c.devs.Lookup(ifindex, &d); err == nil {
			for _, ip := range maps.EndpointIPs(&d) {
				if a, ok := netip.AddrFromSlice(ip); ok {
					ep.IPs = append(ep.IPs, a.Unmap())
				}
			}
		} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil, fmt.Errorf("reading %s[%d]: %w", maps.CniMapEndpointDevs, ifindex, err)
		}
		out = append(out, ep)
	}
	slices.SortFunc(out, func(a, b compile.LocalEndpoint) int { return int(a.Ifindex) - int(b.Ifindex) })
	return out, nil
}

// sync compiles and writes what changed: namespace facts first (ADD reads
// them), policy names, then each endpoint's rules and state.
func (c *PolicyController) sync(l policyListers) (err error) {
	c.mu.Lock()
	since := c.pending
	c.pending = time.Time{}
	compile, allNS, dirty := c.needCompile, c.allNS, c.dirtyNS
	pods, relist := c.dirtyPods, c.relist
	c.needCompile, c.allNS, c.dirtyNS, c.dirtyPods, c.relist = false, false, nil, nil, false
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if err == nil {
			if !since.IsZero() {
				c.record(time.Since(since))
			}
			return
		}
		// Not written: the change is still pending, since when it was
		// seen; the retry does everything again.
		if !since.IsZero() && (c.pending.IsZero() || since.Before(c.pending)) {
			c.pending = since
		}
		c.needCompile, c.allNS, c.relist = true, true, true
		c.written = nil
	}()

	if err := c.namespaceFacts(l, allNS, dirty); err != nil {
		return err
	}
	if relist {
		c.written = nil // every endpoint compared with the maps again
	}
	if !compile {
		return errors.Join(c.writeFacts(allNS, dirty)...)
	}
	eps, err := c.endpoints()
	if err != nil {
		return err
	}
	res, err := c.compileCluster(l, eps, pods, relist)
	if err != nil {
		return err
	}
	// The namespaces a ClusterNetworkPolicy's subject may select start
	// their new pods closed too: the compilation says which.
	hadCNP := len(c.cnpFacts) > 0
	c.cnpFacts = nil
	if c.clusterPolicies > 0 {
		c.cnpFacts = res.Namespaces
	}
	errs := c.writeFacts(allNS || hadCNP, dirty)
	errs = append(errs, c.writeNames(res.Names)...)
	enforced, werrs := c.writeEndpoints(eps, res)
	errs = append(errs, werrs...)
	errs = append(errs, c.deleteGone(res)...)

	c.mu.Lock()
	c.enforced = enforced
	// Every endpoint's state was written, closed where writing failed.
	c.synced = true
	c.mu.Unlock()
	return errors.Join(errs...)
}

// writeFacts writes the namespace facts that changed: of every namespace
// (all, or where ClusterNetworkPolicies give facts), or of those in dirty.
func (c *PolicyController) writeFacts(all bool, dirty map[string]bool) []error {
	facts := c.factsToWrite()
	if all || len(c.cnpFacts) > 0 {
		return c.writeNamespaces(facts)
	}
	var errs []error
	for ns := range dirty {
		f := facts[ns]
		if c.facts[ns] == f {
			continue
		}
		if err := c.pm.SetNamespace(ns, f); err != nil {
			errs = append(errs, err)
			continue
		}
		if f == (policy.NamespaceFact{}) {
			delete(c.facts, ns)
		} else {
			c.facts[ns] = f
		}
	}
	return errs
}

// writeEndpoints writes each endpoint's rules and state, but those the
// last sync wrote from the same result and whose state is still the one
// written; enforced: how many are enforced in a direction.
func (c *PolicyController) writeEndpoints(eps []compile.LocalEndpoint, res *compile.Result) (enforced int, errs []error) {
	states, err := c.pm.EndpointStates()
	if err != nil {
		return 0, []error{err}
	}
	written := make(map[uint32]writtenEndpoint, len(eps))
	for _, ep := range eps {
		er := res.Endpoints[ep.Ifindex]
		st := states[ep.Ifindex]
		if w, ok := c.written[ep.Ifindex]; !ok || w.rules != er || w.state != st {
			if st, err = c.writeEndpoint(ep, er, st); err != nil {
				errs = append(errs, err)
			} else {
				written[ep.Ifindex] = writtenEndpoint{rules: er, state: st}
			}
		} else {
			written[ep.Ifindex] = w
		}
		if policy.State(st.Ingress) == policy.StateEnforce || policy.State(st.Egress) == policy.StateEnforce {
			enforced++
		}
		c.reportCompileError(ep, res.Errors[ep.Ifindex])
	}
	c.written = written
	return enforced, errs
}

// writtenEndpoint is what a sync wrote of an endpoint: its rules (the
// compiler's result, the same object while unchanged) and its state.
type writtenEndpoint struct {
	rules *compile.EndpointRules
	state policy.EndpointState
}

// namespaceFacts brings c.want, the facts of the namespaces with policies,
// up to date: of every namespace (all), or of those in dirty.
func (c *PolicyController) namespaceFacts(l policyListers, all bool, dirty map[string]bool) error {
	if all || c.want == nil {
		want := map[string]policy.NamespaceFact{}
		for _, p := range l.pols.all() {
			ns := p.namespace.Value()
			f := want[ns]
			want[ns] = policy.NamespaceFact{Ingress: f.Ingress || p.fact.Ingress, Egress: f.Egress || p.fact.Egress}
		}
		c.want = want
		return nil
	}
	for ns := range dirty {
		pols, err := l.pols.of(ns)
		if err != nil {
			return err
		}
		var f policy.NamespaceFact
		for _, p := range pols {
			f = policy.NamespaceFact{Ingress: f.Ingress || p.fact.Ingress, Egress: f.Egress || p.fact.Egress}
		}
		if f == (policy.NamespaceFact{}) {
			delete(c.want, ns)
		} else {
			c.want[ns] = f
		}
	}
	return nil
}

// factsToWrite is every namespace's fact: its NetworkPolicies' (c.want),
// and where ClusterNetworkPolicies exist, what the last compilation found
// (c.cnpFacts: a namespace some one's subject may select).
func (c *PolicyController) factsToWrite() map[string]policy.NamespaceFact {
	if len(c.cnpFacts) == 0 {
		return c.want
	}
	m := make(map[string]policy.NamespaceFact, len(c.want)+len(c.cnpFacts))
	for ns, f := range c.want {
		m[ns] = f
	}
	for ns, f := range c.cnpFacts {
		w := m[ns]
		if g := (policy.NamespaceFact{Ingress: w.Ingress || f.Ingress, Egress: w.Egress || f.Egress}); g != (policy.NamespaceFact{}) {
			m[ns] = g
		}
	}
	return m
}

// compileCluster compiles for the local endpoints eps what can select or
// reach them: the policies of their namespaces, every namespace, and the
// pods of their namespaces and of those the policies' peers can select
// (compile.PeerNamespaces). Each part of the scope is published before
// its objects are listed: a change the listing misses (its cache update
// came after) reaches the handlers after the scope that says it matters.
func (c *PolicyController) compileCluster(l policyListers, eps []compile.LocalEndpoint, dirty map[string]bool, relist bool) (*compile.Result, error) {
	local := map[string]bool{}
	for _, ep := range eps {
		local[ep.Namespace] = true
	}
	prev := c.scope.Load()
	sc := &policyScope{local: local, allPods: true}
	if prev != nil {
		sc.pods, sc.allPods = prev.pods, prev.allPods
	}
	c.scope.Store(sc)
	var cl compile.Cluster
	var prs []*policyRecord
	for ns := range local {
		of, err := l.pols.of(ns)
		if err != nil {
			return nil, err
		}
		prs = append(prs, of...)
	}
	var err error
	if cl.Policies, err = c.polObjs.policies(prs); err != nil {
		return nil, err
	}
	if cl.Namespaces, err = l.nss.List(labels.Everything()); err != nil {
		return nil, err
	}
	if l.cnps != nil {
		if cl.ClusterPolicies, err = l.cnps.List(labels.Everything()); err != nil {
			return nil, err
		}
	}
	// The pods of the endpoints (their labels: which policies select
	// them); one the API server does not have yet is closed, peers or not.
	var locals []*corev1.Pod
	for _, ep := range eps {
		obj, ok, err := l.pods.GetByKey(ep.Namespace + "/" + ep.Name)
		if err != nil {
			return nil, err
		}
		if r, _ := obj.(*podRecord); ok && r != nil && (ep.UID == "" || r.uid == "" || ep.UID == r.uid) {
			locals = append(locals, r.pod())
		}
	}
	peers, all := c.compiler.PeerNamespaces(cl.Policies, cl.Namespaces, locals)
	// A ClusterNetworkPolicy selects its subjects and peers in any
	// namespace: with one, every pod may matter.
	all = all || len(cl.ClusterPolicies) > 0
	c.clusterPolicies = len(cl.ClusterPolicies)
	c.scope.Store(&policyScope{local: local, pods: peers, allPods: all})
	nss := make(map[string]bool, len(peers)+len(local))
	for _, m := range []map[string]bool{peers, local} {
		for ns := range m {
			nss[ns] = true
		}
	}
	// The scope published: its pods are read only from here on.
	changes, err := c.scoped.update(l.pods, nss, all, dirty, relist)
	if err != nil {
		return nil, err
	}
	return c.compiler.Update(cl, changes, eps), nil
}

// writeNamespaces writes the namespace facts that changed, and zeroes
// those of namespaces gone; c.facts keeps the non-zero ones written.
func (c *PolicyController) writeNamespaces(facts map[string]policy.NamespaceFact) []error {
	var errs []error
	for ns, f := range facts {
		if c.facts[ns] == f {
			continue
		}
		if err := c.pm.SetNamespace(ns, f); err != nil {
			errs = append(errs, err)
			continue
		}
		c.facts[ns] = f
	}
	for ns := range c.facts {
		if _, ok := facts[ns]; !ok {
			if err := c.pm.SetNamespace(ns, policy.NamespaceFact{}); err != nil {
				errs = append(errs, err)
				continue
			}
			delete(c.facts, ns)
		}
	}
	for ns, f := range c.facts {
		if f == (policy.NamespaceFact{}) {
			delete(c.facts, ns)
		}
	}
	return errs
}

// writeNames writes the policies not written yet, or written otherwise (a
// ClusterNetworkPolicy whose tier or priority changed).
func (c *PolicyController) writeNames(names map[uint32]policy.Source) []error {
	var errs []error
	for id, n := range names {
		if have, ok := c.names[id]; ok && have == n {
			continue
		}
		if _, err := c.pm.SetSource(n); err != nil {
			errs = append(errs, err)
			continue
		}
		c.names[id] = n
	}
	return errs
}

// deleteGone deletes what res no longer has: the rules of ifindexes that
// are no endpoint any more (DEL leaves them), then the policies' names.
func (c *PolicyController) deleteGone(res *compile.Result) []error {
	var errs []error
	for ifindex, byDir := range c.rules {
		if _, ok := res.Endpoints[ifindex]; ok {
			continue
		}
		for d, m := range byDir {
			if err := c.pm.DeleteRules(ifindex, d, prefixes(m)); err != nil {
				errs = append(errs, err)
				continue
			}
			delete(byDir, d)
		}
		if len(byDir) == 0 {
			delete(c.rules, ifindex)
			delete(c.errs, ifindex)
		}
	}
	// Names last: no entry names a policy that is gone any more.
	for id := range c.names {
		if _, ok := res.Names[id]; ok {
			continue
		}
		if err := c.pm.DeleteName(id); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(c.names, id)
	}
	return errs
}

func (c *PolicyController) reportCompileError(ep compile.LocalEndpoint, err error) {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if c.errs[ep.Ifindex] == msg {
		return
	}
	c.errs[ep.Ifindex] = msg
	if err == nil {
		return
	}
	c.log.Warn("network policy not compiled exactly", "err", err)
	c.mu.Lock()
	c.errors++
	c.mu.Unlock()
}

func prefixes(m map[netip.Prefix]policy.Rule) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(m))
	for p := range m {
		out = append(out, p)
	}
	return out
}

// writeEndpoint writes one endpoint's rules and state where they differ
// from what the maps hold (cur: its policy_endpoints entry, zero: none),
// and returns the state written. A direction whose rules or state change
// gets a new generation, so the flows decided under the old rules are
// decided again.
func (c *PolicyController) writeEndpoint(ep compile.LocalEndpoint, er *compile.EndpointRules, cur policy.EndpointState) (policy.EndpointState, error) {
	st := cur
	gens := c.gens[ep.Ifindex]
	gens[0], gens[1] = max(gens[0], cur.IngressGen), max(gens[1], cur.EgressGen)
	changed := false
	var errs []error
	for i, d := range []policy.Direction{policy.Ingress, policy.Egress} {
		want := er.Dir(d)
		state := want.State
		n, err := c.writeRules(ep.Ifindex, d, want)
		if err != nil {
			// Map full or worse: what the rules allow is not what the
			// policies do. Fail closed.
			errs = append(errs, fmt.Errorf("endpoint %s/%s (ifindex %d) %s: %w; its %s stays closed", ep.Namespace, ep.Name, ep.Ifindex, d, err, d))
			state = policy.StateClosed
		}
		have := &st.Ingress
		gen := &st.IngressGen
		if d == policy.Egress {
			have, gen = &st.Egress, &st.EgressGen
		}
		if n == 0 && policy.State(*have) == state {
			continue
		}
		changed = true
		*have = uint8(state)
		gens[i]++
		if gens[i] == 0 {
			gens[i] = 1
		}
		*gen = gens[i]
	}
	c.gens[ep.Ifindex] = gens
	if changed {
		if err := c.pm.SetEndpoint(ep.Ifindex, st); err != nil {
			errs = append(errs, err)
		}
	}
	return st, errors.Join(errs...)
}

// writeRules brings policy_rules' entries of (ifindex, d) to want's (none
// unless enforced): new and changed entries first, then the vanished ones.
// n: how many entries it wrote or deleted.
func (c *PolicyController) writeRules(ifindex uint32, d policy.Direction, want *compile.DirRules) (n int, err error) {
	have := c.dirRules(ifindex, d)
	var entries []policy.Entry
	if want.State == policy.StateEnforce {
		entries = want.Entries
	}
	keep := make(map[netip.Prefix]bool, len(entries))
	for _, e := range entries {
		keep[e.Prefix] = true
		if r, ok := have[e.Prefix]; ok && r == e.Rule {
			continue
		}
		if err := c.pm.PutRules(ifindex, d, []policy.Entry{e}); err != nil {
			return n, err
		}
		have[e.Prefix] = e.Rule
		n++
	}
	var gone []netip.Prefix
	for p := range have {
		if !keep[p] {
			gone = append(gone, p)
		}
	}
	if len(gone) == 0 {
		return n, nil
	}
	if err := c.pm.DeleteRules(ifindex, d, gone); err != nil {
		return n, err
	}
	for _, p := range gone {
		delete(have, p)
	}
	return n + len(gone), nil
}

func (c *PolicyController) record(d time.Duration) {
	if len(c.lats) < policyLatencies {
		c.lats = append(c.lats, d)
	} else {
		c.lats[c.latNext] = d
		c.latNext = (c.latNext + 1) % policyLatencies
	}
	s := d.Seconds()
	c.hist.count++
	c.hist.sum += s
	for i, b := range policyLatencyBuckets {
		if s <= b {
			c.hist.counts[i]++
			break
		}
	}
}

// Synced says whether the informers have synced and a first full write is
// done.
func (c *PolicyController) Synced() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.synced
}

// Latencies are the last writes' delays (up to 10,000), oldest first: from
// the first change seen (an API event, an endpoint found by the poll) to
// the maps written.
func (c *PolicyController) Latencies() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append(slices.Clone(c.lats[c.latNext:]), c.lats[:c.latNext]...)
}

// PolicyStatus is what the agent's /readyz says of the network policies.
type PolicyStatus struct {
	// Running: the controller has its maps open, watches and writes.
	Running bool `json:"running"`
	// ClusterNetworkPolicies: it watches them too (the API server serves
	// them).
	ClusterNetworkPolicies bool `json:"clusterNetworkPolicies"`
	// Synced: a first full write of the maps is done.
	Synced bool `json:"synced"`
	// Problem is why the last start failed, while it is retried; Retries
	// how many starts failed since it last ran.
	Problem string `json:"problem,omitempty"`
	Retries int    `json:"retries,omitempty"`
}

// Status says whether the controller runs, and if not why.
func (c *PolicyController) Status() PolicyStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	return PolicyStatus{Running: c.running, ClusterNetworkPolicies: c.running && c.cnp, Synced: c.synced, Problem: c.problem, Retries: c.retries}
}

// policyStats is what the metrics report.
type policyStats struct {
	running  bool
	synced   bool
	enforced int
	errors   uint64
	hist     latencyHist
}

func (c *PolicyController) stats() policyStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.hist
	h.counts = slices.Clone(h.counts)
	return policyStats{running: c.running, synced: c.synced, enforced: c.enforced, errors: c.errors, hist: h}
}

// ClearPolicies removes what an earlier agent wrote for network policies:
// the namespace facts first (ADD then starts every pod open), the endpoint
// states, rules and names, and turns the programs' lookups off. For an
// agent that runs without network policies (-network-policy=false): left
// in place, the facts would keep closing new pods of those namespaces, with
// nobody to open them. Maps not pinned: nothing to do.
func ClearPolicies(n *nodestate.Node) error {
	if !n.HasMap(maps.CniMapPolicyNamespaces) {
		return nil
	}
	nd := n.Reopen()
	defer nd.Close()
	pm, err := policy.Open(nd)
	if err != nil {
		return err
	}
	for _, m := range []struct {
		name string
		m    *ebpf.Map
	}{{maps.CniMapPolicyNamespaces, pm.NamespaceMap}, {maps.CniMapPolicyEndpoints, pm.EndpointMap}, {maps.CniMapPolicyRules, pm.RuleMap}, {maps.CniMapPolicySources, pm.NameMap}} {
		if err := maps.Clear(m.m); err != nil {
			return fmt.Errorf("clearing %s: %w", m.name, err)
		}
	}
	return pm.SetActive(false)
}
