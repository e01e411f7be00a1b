package agent

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/ebpf-cni/ebpf-cni/pkg/flows"
	cnimaps "github.com/ebpf-cni/ebpf-cni/pkg/maps" // "maps" is the standard library's here
	nodestate "github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// Defaults of the translated destinations' lease: how long the datapath
// trusts the set after a write, and how often the agent renews it. A stopped
// agent (an upgrade, a crash) leaves the set in place, and at most
// DefaultXlatLease later every new flow meets netfilter again, as without
// the agent.
const (
	DefaultXlatLease = 30 * time.Second
	DefaultXlatRenew = 10 * time.Second
)

// xlatDebounce gathers a burst of API events (a Service created with its
// EndpointSlices, a rollout) into one write.
const xlatDebounce = 100 * time.Millisecond

// xlatVerify: this often the pinned set is read back and repaired, even
// when the API did not change (someone deleted an entry by hand).
const xlatVerify = time.Minute

// XlatConfig is how the translated destinations are kept.
type XlatConfig struct {
	// Node is the agent's handle on the plugin's node (reopened for each
	// write).
	Node *nodestate.Node
	// ServiceCIDRs are the cluster's Service ranges (kube-apiserver
	// --service-cluster-ip-range), when known: a ClusterIP allocated
	// since the last write is in the set already.
	ServiceCIDRs []netip.Prefix
	// Lease and Renew: DefaultXlatLease and DefaultXlatRenew when zero.
	Lease, Renew time.Duration
	// Nodes is the agent's Node informer (Agent.Nodes), which the agent
	// starts: the set reads the Nodes of the agent's one Node watch, whose
	// transform keeps their InternalIPs and ExternalIPs. Nil: the
	// controller watches Nodes itself (run on its own, as in its tests).
	Nodes  coreinformers.NodeInformer
	Logger *slog.Logger
}

// XlatController keeps the plugin's set of the destinations the node's
// netfilter may translate (bpf/lib/xlat.h, pkg/flows Translated) in line
// with the API: every Service's ClusterIPs, externalIPs and load-balancer
// IPs, every Node's addresses (NodePorts), and the Service ranges. It
// writes the set, then renews the lease on it, and renews it again every
// Renew while it can write; when it cannot (no bpffs, the maps), it does
// not renew, and the lease runs out. When it stops, the set stays and the
// lease runs out: new flows then meet netfilter as they did before.
type XlatController struct {
	cfg    XlatConfig
	client kubernetes.Interface
	log    *slog.Logger

	mu      sync.Mutex
	written flows.Set // what the last write made the pinned set
	checked time.Time // when the pinned set was last read back
	renewed time.Time
	lastErr error
	writes  int
}

// NewXlatController prepares one; Run starts it.
func NewXlatController(client kubernetes.Interface, cfg XlatConfig) *XlatController {
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultXlatLease
	}
	if cfg.Renew <= 0 || cfg.Renew >= cfg.Lease {
		cfg.Renew = min(DefaultXlatRenew, cfg.Lease/3)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &XlatController{cfg: cfg, client: client, log: cfg.Logger}
}

// slimService keeps of a Service the addresses kube-proxy translates.
func slimService(obj any) (any, error) {
	s, ok := obj.(*corev1.Service)
	if !ok {
		return obj, nil
	}
	out := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace, UID: s.UID, ResourceVersion: s.ResourceVersion}}
	out.Spec.Type = s.Spec.Type
	out.Spec.ClusterIP, out.Spec.ClusterIPs, out.Spec.ExternalIPs = s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.ExternalIPs
	for _, in := range s.Status.LoadBalancer.Ingress {
		if in.IP != "" {
			out.Status.LoadBalancer.Ingress = append(out.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: in.IP})
		}
	}
	return out, nil
}

// xlatSame: an update that changes nothing XlatSet reads (a Node's
// heartbeat or pod ranges, a Service's endpoints or labels). A Service is
// slimmed to what XlatSet reads; a Node to what the routes read as well
// (slimNode), so of a Node only its addresses are compared.
func xlatSame(old, cur any) bool {
	switch o := old.(type) {
	case *corev1.Service:
		c, ok := cur.(*corev1.Service)
		return ok && equality.Semantic.DeepEqual(o.Spec, c.Spec) && equality.Semantic.DeepEqual(o.Status, c.Status)
	case *corev1.Node:
		c, ok := cur.(*corev1.Node)
		return ok && equality.Semantic.DeepEqual(o.Status.Addresses, c.Status.Addresses)
	}
	return false
}

func slimXlat(obj any) (any, error) {
	switch obj.(type) {
	case *corev1.Service:
		return slimService(obj)
	case *corev1.Node:
		return slimNode(obj) // the agent's, which keeps what the routes read besides
	}
	return obj, nil
}

// XlatSet is the set of destinations the node's netfilter may translate:
// kube-proxy writes rules for every Service's ClusterIPs, externalIPs and
// load-balancer IPs, and for NodePorts on the node's addresses (every
// Node's are taken: a node's own addresses are among them, and a pod's
// packet to another node's NodePort then meets netfilter here too, as
// before). Addresses that do not parse are left out (the API server
// validates them).
func XlatSet(services []*corev1.Service, nodes []*corev1.Node, serviceCIDRs []netip.Prefix) flows.Set {
	s := flows.Set{}
	for _, p := range serviceCIDRs {
		s.Add(p, cnimaps.CniXlatKindXLAT_SERVICE_RANGE)
	}
	addr := func(v string, kind cnimaps.CniXlatKind) {
		if a, err := netip.ParseAddr(v); err == nil {
			s.AddAddr(a, kind)
		}
	}
	for _, svc := range services {
		ips := svc.Spec.ClusterIPs
		if len(ips) == 0 && svc.Spec.ClusterIP != "" {
			ips = []string{svc.Spec.ClusterIP}
		}
		for _, ip := range ips {
			addr(ip, cnimaps.CniXlatKindXLAT_CLUSTER_IP) // "None" (headless) does not parse
		}
		for _, ip := range svc.Spec.ExternalIPs {
			addr(ip, cnimaps.CniXlatKindXLAT_EXTERNAL_IP)
		}
		for _, in := range svc.Status.LoadBalancer.Ingress {
			addr(in.IP, cnimaps.CniXlatKindXLAT_LOAD_BALANCER)
		}
	}
	for _, n := range nodes {
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
				addr(a.Address, cnimaps.CniXlatKindXLAT_NODE)
			}
		}
	}
	return s
}

// Run keeps the set until ctx ends. It returns only then: a failure to
// write is logged, retried at the next renewal, and the lease runs out
// meanwhile.
func (c *XlatController) Run(ctx context.Context) error {
	factory := informers.NewSharedInformerFactoryWithOptions(c.client, 0, informers.WithTransform(slimXlat))
	services := factory.Core().V1().Services()
	nodes := c.cfg.Nodes
	if nodes == nil {
		nodes = factory.Core().V1().Nodes()
	}
	kick := make(chan struct{}, 1)
	h := cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { poke(kick) },
		UpdateFunc: func(old, cur any) {
			if !xlatSame(old, cur) {
				poke(kick)
			}
		},
		DeleteFunc: func(any) { poke(kick) },
	}
	var synced []cache.InformerSynced
	for _, inf := range []cache.SharedIndexInformer{services.Informer(), nodes.Informer()} {
		reg, err := inf.AddEventHandler(h)
		if err != nil {
			return fmt.Errorf("watching services and nodes: %w", err)
		}
		// The agent's Node informer outlives this controller's handler.
		defer func() { _ = inf.RemoveEventHandler(reg) }()
		synced = append(synced, reg.HasSynced)
	}
	factory.Start(ctx.Done()) // Services, and Nodes when not the agent's
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return ctx.Err()
	}
	step := func() {
		svcs, err := services.Lister().List(labels.Everything())
		if err == nil {
			var ns []*corev1.Node
			if ns, err = nodes.Lister().List(labels.Everything()); err == nil {
				err = c.Sync(XlatSet(svcs, ns, c.cfg.ServiceCIDRs))
			}
		}
		if err != nil {
			c.log.Warn("translated destinations: not renewing the lease (new flows meet netfilter once it runs out)", "err", err)
		}
	}
	step()
	renew := time.NewTicker(c.cfg.Renew)
	defer renew.Stop()
	var debounce <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			c.log.Info("translated destinations: stopping; the set stays, its lease runs out", "lease", c.cfg.Lease)
			return nil
		case <-kick:
			if debounce == nil {
				debounce = time.After(xlatDebounce)
			}
		case <-debounce:
			debounce = nil
			step()
		case <-renew.C:
			step()
		}
	}
}

func poke(kick chan struct{}) {
	select {
	case kick <- struct{}{}:
	default:
	}
}

// Sync writes want when it differs from the last write (or the pinned set
// was not read back for xlatVerify), then renews the lease. On an error the
// lease is not renewed.
func (c *XlatController) Sync(want flows.Set) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.sync(want)
	c.lastErr = err
	return err
}

func (c *XlatController) sync(want flows.Set) error {
	nd := c.cfg.Node.Reopen()
	defer nd.Close()
	if err := nd.CheckBPFFS(); err != nil {
		return err
	}
	t, err := flows.OpenTranslated(nd)
	if err != nil {
		return err
	}
	now := time.Now()
	if !maps.Equal(want, c.written) || now.Sub(c.checked) >= xlatVerify {
		if err := t.Write(want); err != nil {
			c.written = nil
			return err
		}
		if !maps.Equal(want, c.written) {
			c.log.Info("translated destinations written", "entries", len(want))
		}
		c.written, c.checked = want, now
		c.writes++
	}
	if err := t.Renew(c.cfg.Lease); err != nil {
		return err
	}
	c.renewed = now
	return nil
}

// XlatStatus is what the controller last did.
type XlatStatus struct {
	Entries int
	Renewed time.Time // zero: never
	Err     error
}

// Status reports the last write and renewal.
func (c *XlatController) Status() XlatStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	return XlatStatus{Entries: len(c.written), Renewed: c.renewed, Err: c.lastErr}
}
