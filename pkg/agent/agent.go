package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Config is how the agent runs.
type Config struct {
	// NodeName is this node's Node object (the DaemonSet passes
	// spec.nodeName).
	NodeName string
	// Resync is how often everything is compared with the Node objects
	// (routes someone deleted come back, stale ones go). Default 1 minute.
	Resync time.Duration
	// HealthAddr serves /healthz and /readyz (e.g. 127.0.0.1:9965); empty:
	// none.
	HealthAddr string
	// Policy is the NetworkPolicy controller running beside the routes
	// (nil: network policies off): Status reports it, and the agent is not
	// ready while it cannot run.
	Policy *PolicyController
	Logger *slog.Logger
}

// DefaultHealthAddr is where the DaemonSet's probes ask.
const DefaultHealthAddr = "127.0.0.1:9965"

// fullSync is the queue key of SyncAll; node names are never empty.
const fullSync = ""

// stuckAfter: a single item taking this long means the worker is wedged
// (a netlink call that never returns), and /healthz says so.
const stuckAfter = 2 * time.Minute

// Agent watches Node objects and keeps a NodeRoutes in line with them.
type Agent struct {
	cfg    Config
	routes NodeRoutes
	log    *slog.Logger
	// factory holds the agent's one Node watch (nodes), which Run starts:
	// the routes and, through Nodes, other controllers read it.
	factory informers.SharedInformerFactory
	nodes   coreinformers.NodeInformer

	mu         sync.Mutex
	cacheSync  bool
	busySince  time.Time
	rec        *Reconciler
	syncErrors int // failed syncs, for the metrics
}

// New prepares an agent; Run starts it.
func New(client kubernetes.Interface, routes NodeRoutes, cfg Config) (*Agent, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("no node name: set NODE_NAME (the DaemonSet passes spec.nodeName) or -node")
	}
	if cfg.Resync <= 0 {
		cfg.Resync = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(slimNode))
	nodes := factory.Core().V1().Nodes()
	nodes.Informer() // in the factory from now on: Run's Start starts it whoever adds handlers
	return &Agent{cfg: cfg, routes: routes, log: cfg.Logger, factory: factory, nodes: nodes}, nil
}

// Nodes is the agent's Node informer: its one watch of Nodes, which Run
// starts and stops. Its objects are slimmed (slimNode) to their pod ranges,
// InternalIPs and ExternalIPs. Controllers that read Nodes beside the
// routes (XlatConfig.Nodes) add their handlers to it instead of watching
// Nodes again.
func (a *Agent) Nodes() coreinformers.NodeInformer { return a.nodes }

// Run watches until ctx ends, once per Agent. What it installed stays when
// it returns: pods keep reaching other nodes while the agent is down or
// being upgraded.
func (a *Agent) Run(ctx context.Context) error {
	if a.cfg.HealthAddr != "" {
		l, err := net.Listen("tcp", a.cfg.HealthAddr)
		if err != nil {
			return fmt.Errorf("listening for health checks on %s: %w", a.cfg.HealthAddr, err)
		}
		srv := &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(l) }()
		defer srv.Close()
	}

	factory, nodes := a.factory, a.nodes
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](200*time.Millisecond, 30*time.Second))
	defer queue.ShutDown()
	rec := NewReconciler(a.cfg.NodeName, a.routes, nodes.Lister(), a.log)
	a.mu.Lock()
	a.rec = rec
	a.mu.Unlock()

	_, err := nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { a.enqueue(queue, obj) },
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Node)
			c, ok2 := cur.(*corev1.Node)
			if ok1 && ok2 && unchanged(o, c) {
				return // a heartbeat or a label: nothing the entries depend on
			}
			a.enqueue(queue, cur)
		},
		DeleteFunc: func(obj any) { a.enqueue(queue, obj) },
	})
	if err != nil {
		return fmt.Errorf("watching nodes: %w", err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()

	a.log.Info("waiting for the node list", "node", a.cfg.NodeName, "mode", a.routes.Mode())
	if !cache.WaitForCacheSync(ctx.Done(), nodes.Informer().HasSynced) {
		return ctx.Err()
	}
	a.mu.Lock()
	a.cacheSync = true
	a.mu.Unlock()
	queue.Add(fullSync)

	go func() {
		t := time.NewTicker(a.cfg.Resync)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				queue.ShutDown()
				return
			case <-t.C:
				queue.Add(fullSync)
			}
		}
	}()
	for a.processNext(queue, rec) {
	}
	return ctx.Err()
}

// slimNode keeps of a Node what its readers read (and its resource
// version): PeerOf (the pod ranges, the InternalIPs) and XlatSet (the
// InternalIPs and ExternalIPs), both fed by the agent's one Node watch. A
// kubelet's Node carries its images, conditions and volumes, tens of KB
// each agent would keep of every node.
func slimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	out := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion}}
	out.Spec.PodCIDR, out.Spec.PodCIDRs = n.Spec.PodCIDR, n.Spec.PodCIDRs
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
			out.Status.Addresses = append(out.Status.Addresses, corev1.NodeAddress{Type: a.Type, Address: a.Address})
		}
	}
	return out, nil
}

func unchanged(o, c *corev1.Node) bool {
	if o.ResourceVersion == c.ResourceVersion {
		return false // a re-list delivers the same object again: look anyway
	}
	po, e1 := PeerOf(o)
	pc, e2 := PeerOf(c)
	return po.Equal(pc) && (e1 == nil) == (e2 == nil)
}

func (a *Agent) enqueue(q workqueue.TypedRateLimitingInterface[string], obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	if key == a.cfg.NodeName {
		// This node's ranges are what every peer is checked against.
		q.Add(fullSync)
		return
	}
	q.Add(key)
}

func (a *Agent) processNext(q workqueue.TypedRateLimitingInterface[string], rec *Reconciler) bool {
	key, quit := q.Get()
	if quit {
		return false
	}
	defer q.Done(key)
	a.setBusy(time.Now())
	defer a.setBusy(time.Time{})
	var err error
	if key == fullSync {
		err = rec.SyncAll()
	} else {
		err = rec.SyncNode(key)
	}
	switch {
	case err == nil:
		q.Forget(key)
	case IsConfigProblem(err):
		// Only a change of the Node helps; its update event comes back here.
		q.Forget(key)
		a.log.Warn("node not routed", "node", key, "err", err)
	default:
		a.log.Warn("sync failed, retrying", "node", key, "err", err, "retries", q.NumRequeues(key))
		a.mu.Lock()
		a.syncErrors++
		a.mu.Unlock()
		q.AddRateLimited(key)
	}
	return true
}

// syncStats reports the agent's syncs to the metrics.
func (a *Agent) syncStats() syncStats {
	a.mu.Lock()
	st, rec := syncStats{errors: a.syncErrors}, a.rec
	a.mu.Unlock()
	if rec != nil {
		st.last, st.present = rec.lastSync()
	}
	return st
}

func (a *Agent) setBusy(t time.Time) {
	a.mu.Lock()
	a.busySince = t
	a.mu.Unlock()
}

// Status is what /readyz and /healthz answer.
type Status struct {
	Ready bool   `json:"ready"`
	Live  bool   `json:"live"`
	Node  string `json:"node"`
	Mode  string `json:"mode"`
	// Peers: nodes with entries; Routes: entries installed.
	Peers    int      `json:"peers"`
	Routes   int      `json:"routes"`
	Reason   string   `json:"reason,omitempty"`
	Problems []string `json:"problems,omitempty"`
	// Policy is the NetworkPolicy controller's state (absent: off).
	Policy *PolicyStatus `json:"policy,omitempty"`
}

// Status says whether the entries are current: the node list is in, a full
// sync ran without error, and no node has a problem (this one's missing pod
// range included); and whether the network policies, when on, run. Either
// failing makes the agent not ready, with the other going on: a rollout of
// an agent that cannot enforce policies (no bpffs mounted) stops at its
// first node, while that node keeps its routes.
func (a *Agent) Status() Status {
	a.mu.Lock()
	s := Status{Node: a.cfg.NodeName, Mode: string(a.routes.Mode()), Live: a.busySince.IsZero() || time.Since(a.busySince) < stuckAfter}
	synced, rec := a.cacheSync, a.rec
	a.mu.Unlock()
	if !s.Live {
		s.Reason = "the worker has been stuck on one item for more than " + stuckAfter.String()
	}
	switch {
	case !synced || rec == nil:
		if s.Reason == "" {
			s.Reason = "waiting for the node list from the API server"
		}
	default:
		rs := Status{}
		rec.state(&rs)
		s.Peers, s.Routes, s.Problems = rs.Peers, rs.Routes, rs.Problems
		if s.Reason == "" {
			s.Reason = rs.Reason
		}
	}
	if a.cfg.Policy != nil {
		ps := a.cfg.Policy.Status()
		s.Policy = &ps
		if !ps.Running && s.Reason == "" {
			s.Reason = "network policies not enforced, retrying: " + cmp.Or(ps.Problem, "starting")
		}
	}
	s.Ready = s.Live && s.Reason == ""
	return s
}

// Handler serves /healthz (the worker is not wedged) and /readyz (Status
// is ready), each with the Status as JSON: 200 when it holds, 503 if not.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	serve := func(ok func(Status) bool) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			s := a.Status()
			w.Header().Set("Content-Type", "application/json")
			if !ok(s) {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			_ = json.NewEncoder(w).Encode(s)
		}
	}
	mux.HandleFunc("/healthz", serve(func(s Status) bool { return s.Live }))
	mux.HandleFunc("/readyz", serve(func(s Status) bool { return s.Ready }))
	return mux
}
