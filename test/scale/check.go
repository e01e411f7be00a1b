package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy/compile"
)

// snapshot is the API server's policies, pods and namespaces, listed now.
func (h *harness) snapshot(ctx context.Context) (compile.Cluster, error) {
	var cl compile.Cluster
	pols, err := h.client.NetworkingV1().NetworkPolicies("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return cl, err
	}
	pods, err := h.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return cl, err
	}
	nss, err := h.client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return cl, err
	}
	cl.Policies = ptrs[networkingv1.NetworkPolicy](pols.Items)
	cl.Pods = ptrs[corev1.Pod](pods.Items)
	cl.Namespaces = ptrs[corev1.Namespace](nss.Items)
	return cl, nil
}

func ptrs[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}

// endpoints reads the node's endpoints as the agent does: endpoint_pods
// and their addresses in endpoint_devs.
func (a *agentNode) endpoints() ([]compile.LocalEndpoint, error) {
	pm, err := a.nd.Map(maps.CniMapEndpointPods)
	if err != nil {
		return nil, err
	}
	dm, err := a.nd.Map(maps.CniMapEndpointDevs)
	if err != nil {
		return nil, err
	}
	pods, err := endpoint.ReadPods(pm)
	if err != nil {
		return nil, err
	}
	var out []compile.LocalEndpoint
	for ifindex, p := range pods {
		ep := compile.LocalEndpoint{Ifindex: ifindex, Namespace: p.Namespace, Name: p.Name, UID: p.UID}
		var d maps.CniEndpointDev
		if err := dm.Lookup(ifindex, &d); err == nil {
			for _, ip := range maps.EndpointIPs(&d) {
				if ad, ok := netip.AddrFromSlice(ip); ok {
					ep.IPs = append(ep.IPs, ad.Unmap())
				}
			}
		} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil, err
		}
		out = append(out, ep)
	}
	slices.SortFunc(out, func(x, y compile.LocalEndpoint) int { return int(x.Ifindex) - int(y.Ifindex) })
	return out, nil
}

// diff compares the agent's maps with a compilation from scratch of cl for
// its endpoints: every endpoint's state and rules both ways, no rules of
// ifindexes that are no endpoint, and the namespace facts. It returns what
// differs (empty: equal).
func (a *agentNode) diff(cl compile.Cluster) ([]string, error) {
	eps, err := a.endpoints()
	if err != nil {
		return nil, err
	}
	res := compile.Compile(cl, eps)
	states, err := a.pm.EndpointStates()
	if err != nil {
		return nil, err
	}
	rules, err := a.pm.ReadRules()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, ep := range eps {
		want := res.Endpoints[ep.Ifindex]
		st := states[ep.Ifindex]
		for _, d := range []policy.Direction{policy.Ingress, policy.Egress} {
			have := policy.State(st.Ingress)
			if d == policy.Egress {
				have = policy.State(st.Egress)
			}
			w := want.Dir(d)
			if have != w.State {
				out = append(out, fmt.Sprintf("%s/%s %s: state %s, want %s", ep.Namespace, ep.Name, d, have, w.State))
			}
			var wantEntries []policy.Entry
			if w.State == policy.StateEnforce {
				wantEntries = w.Entries
			}
			haveEntries := map[netip.Prefix]policy.Rule{}
			for _, e := range rules[ep.Ifindex][d] {
				haveEntries[e.Prefix] = e.Rule
			}
			for _, e := range wantEntries {
				r, ok := haveEntries[e.Prefix]
				switch {
				case !ok:
					out = append(out, fmt.Sprintf("%s/%s %s %s: missing", ep.Namespace, ep.Name, d, e.Prefix))
				case r != e.Rule:
					out = append(out, fmt.Sprintf("%s/%s %s %s: %+v, want %+v", ep.Namespace, ep.Name, d, e.Prefix, r, e.Rule))
				}
				delete(haveEntries, e.Prefix)
			}
			for p := range haveEntries {
				out = append(out, fmt.Sprintf("%s/%s %s %s: an entry the policies do not give", ep.Namespace, ep.Name, d, p))
			}
		}
		delete(rules, ep.Ifindex)
	}
	for ifindex := range rules {
		out = append(out, fmt.Sprintf("ifindex %d: rules of no endpoint", ifindex))
	}
	facts, err := a.pm.NamespaceFacts()
	if err != nil {
		return nil, err
	}
	for ns, f := range res.Namespaces {
		if facts[ns] != f {
			out = append(out, fmt.Sprintf("namespace %s: fact %+v, want %+v", ns, facts[ns], f))
		}
		delete(facts, ns)
	}
	for ns, f := range facts {
		if f != (policy.NamespaceFact{}) {
			out = append(out, fmt.Sprintf("namespace %s: fact %+v of no namespace", ns, f))
		}
	}
	return out, nil
}

// checkAll compares every agent's maps with a compilation from scratch;
// it returns how many entries differ in all, and the first few.
func (h *harness) checkAll(ctx context.Context) (int, []string, error) {
	cl, err := h.snapshot(ctx)
	if err != nil {
		return 0, nil, err
	}
	n := 0
	var first []string
	for _, a := range h.agents {
		d, err := a.diff(cl)
		if err != nil {
			return 0, nil, fmt.Errorf("%s: %w", a.name, err)
		}
		n += len(d)
		for _, s := range d {
			if len(first) < 5 {
				first = append(first, a.name+": "+s)
			}
		}
	}
	return n, first, nil
}
