package main

import (
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/utils/sysctl"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/pkg/cluster"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// The Kubernetes paths: pods across nodes, and masquerade on a node whose
// netfilter holds a kube-proxy-shaped rule set of many Services.

func init() {
	pathDoc["cross-node"] = "A pod on node A to a pod on node B, two nodes on one L2 segment (a bridge in a namespace of its own): RR, CRR, iperf3. " +
		"REF is kubenet's setup: Debian's `bridge` (isGateway, no masquerade) + `host-local` on each node and a route on each node to the other's pod range via it; " +
		"EBPF is ebpf-cni with `clusterCIDRs` over the same routes (direct routing: bpf_fib_lookup + redirect_neigh out, redirect_peer in); " +
		"RAW is the same namespaces routed by the nodes with no plugin: a veth from each pod to its node, the same routes, no bridge, no rules."
	pathDoc["cross-node-vxlan"] = "As cross-node, with EBPF on its VXLAN overlay (`overlay: vxlan`: BPF sets the tunnel key and redirects to a flow-based VXLAN device; the receiving node's from_netdev decapsulates a non-GSO packet itself and redirects it into the pod, a GSO one (bulk TCP) goes through the device and its from_tunnel; pods' MTU 1450). " +
		"REF is REF-VXLAN, flannel's `vxlan` backend, the common overlay of small clusters, as its daemon sets a node up (nettest.FlannelVXLAN): a kernel VXLAN device flannel.1 (VNI 1, port 8472, no learning) with static neighbour, FDB and route entries for the other node, flannel's POSTROUTING and FORWARD rules, and its CNI plugin's delegate, Debian's `bridge` (cni0, isDefaultGateway, hairpinMode, MTU 1450) + `host-local`. " +
		"RAW is cross-node's (routed, no overlay): the limit, the target is 85% of it."
	pathDoc["masquerade-services"] = fmt.Sprintf("As masquerade, with a kube-proxy-shaped iptables rule set of %d Services (ClusterIP and NodePort, two endpoints each: KUBE-SERVICES, KUBE-SVC-*, KUBE-SEP-*, KUBE-MARK-MASQ, KUBE-POSTROUTING, KUBE-FORWARD) in the netfilter of the REF and EBPF nodes. "+
		"Every new connection's first packet meets it: REF's through the bridge and the stack, EBPF's because that is how ebpf-cni lets kube-proxy see a flow; later packets go through REF's conntrack and EBPF's fast path. RAW is masquerade's (no rules).", benchServices)
}

// benchServices is how many Services the masquerade-services path installs.
const benchServices = 1000

// crossPair is a setup's client pod (node A) and server pod (node B).
type crossPair struct{ client, server *pod }

// crossNode measures one cross-node path: the setups' pod pairs, then RR,
// CRR and TCP as on every traffic path.
func (b *bench) crossNode(path string, overlay bool) error {
	b.logf("%s: %d rounds of RR and TCP, %d of CRR, a pod on node A to a pod on node B", path, b.cfg.runs, b.cfg.crrRounds)
	ss := b.pick(path, "", p2pMetrics, true)
	var cs []clientServer
	for _, s := range ss {
		c, err := b.newCluster()
		if err != nil {
			return err
		}
		var pair crossPair
		switch s.name {
		case REF:
			if overlay {
				pair, err = b.crossFlannel(c, path)
			} else {
				pair, err = b.crossREF(c, path)
			}
		case EBPF:
			pair, err = b.crossEBPF(c, path, overlay)
		default:
			pair, err = b.crossRAW(c)
		}
		if err != nil {
			return fmt.Errorf("%s %s: %w", path, s.name, err)
		}
		cs = append(cs, clientServer{s.name, pair.client.ns, pair.server.ns, pair.server.ip, echoPort})
	}
	if err := b.serve(cs, true); err != nil {
		return err
	}
	return b.traffic(path, cs, true)
}

// newCluster makes two nodes on one segment, removed by cleanup.
func (b *bench) newCluster() (*nettest.Cluster, error) {
	c, err := nettest.NewCluster(2, false)
	if err != nil {
		return nil, err
	}
	if err := b.track(func() { b.clusters = append(b.clusters, c) }); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// crossAttach adds one pod on each node through the plugin chains lists[i].
func (b *bench) crossAttach(c *nettest.Cluster, path, name string, lists [2][]byte) (crossPair, error) {
	var pods [2]*pod
	for i, n := range c.Nodes[:2] {
		list, err := libcni.ConfListFromBytes(lists[i])
		if err != nil {
			return crossPair{}, err
		}
		dir := filepath.Join(b.tmp, path, name, n.Name)
		s := &setup{name: name, node: n.Node, list: list, cni: nettest.NewCNI(n.Node, []string{b.cfg.bin, b.refBin}, filepath.Join(dir, "cache"))}
		podNS, err := b.newNS()
		if err != nil {
			return crossPair{}, err
		}
		if pods[i], _, err = s.attach(podNS, fmt.Sprintf("%s-%s-%d", path, name, i), nil); err != nil {
			return crossPair{}, err
		}
	}
	return crossPair{pods[0], pods[1]}, nil
}

// crossREF is kubenet's setup: bridge + host-local per node, routes.
func (b *bench) crossREF(c *nettest.Cluster, path string) (crossPair, error) {
	if err := c.RouteDirect(); err != nil {
		return crossPair{}, err
	}
	var lists [2][]byte
	for i, n := range c.Nodes[:2] {
		var err error
		lists[i], err = json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": "kubenet", "plugins": []any{
			map[string]any{"type": "bridge", "bridge": "cbr0", "isGateway": true, "ipMasq": false,
				"ipam": map[string]any{"type": "host-local", "dataDir": filepath.Join(b.tmp, path, "ref", n.Name, "host-local"),
					"ranges": []any{[]any{map[string]any{"subnet": n.PodCIDR4.String()}}},
					"routes": []any{map[string]any{"dst": "0.0.0.0/0"}}}},
		}})
		if err != nil {
			return crossPair{}, err
		}
	}
	return b.crossAttach(c, path, REF, lists)
}

// crossFlannel is flannel's vxlan backend: its daemon's device, entries and
// rules (nettest.FlannelVXLAN), its CNI plugin's delegate per node.
func (b *bench) crossFlannel(c *nettest.Cluster, path string) (crossPair, error) {
	if err := c.FlannelVXLAN(); err != nil {
		return crossPair{}, err
	}
	var lists [2][]byte
	for i, n := range c.Nodes[:2] {
		var err error
		lists[i], err = json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": "cbr0", "plugins": []any{
			map[string]any{"type": "bridge", "bridge": "cni0", "isGateway": true, "isDefaultGateway": true, "hairpinMode": true,
				"ipMasq": false, "mtu": nettest.FlannelMTU,
				"ipam": map[string]any{"type": "host-local", "dataDir": filepath.Join(b.tmp, path, "ref", n.Name, "host-local"),
					"ranges": []any{[]any{map[string]any{"subnet": n.PodCIDR4.String()}}}}},
		}})
		if err != nil {
			return crossPair{}, err
		}
	}
	return b.crossAttach(c, path, REF, lists)
}

// crossEBPF is ebpf-cni with the cluster's ranges: direct routing over the
// nodes' routes, or the overlay with each node's tunnel endpoint.
func (b *bench) crossEBPF(c *nettest.Cluster, path string, overlay bool) (crossPair, error) {
	var lists [2][]byte
	for i, n := range c.Nodes[:2] {
		bpfRoot := filepath.Join(b.bpfs, path, n.Name)
		stateDir := b.runDir(path, "ebpf", n.Name, "state")
		p := map[string]any{"type": "ebpf-cni", "bpfRoot": bpfRoot, "stateDir": stateDir, "ipMasq": true,
			"clusterCIDRs": []string{nettest.ClusterCIDR4.String()},
			"ipam":         map[string]any{"type": "ebpf-ipam", "ranges": []any{[]any{map[string]any{"subnet": n.PodCIDR4.String()}}}}}
		if overlay {
			p["overlay"] = "vxlan"
			other := c.Nodes[1-i]
			nd, err := node.Open(node.Options{BPFRoot: bpfRoot, StateDir: stateDir, Lock: node.Unlocked})
			if err != nil {
				return crossPair{}, err
			}
			ts, err := cluster.OpenTunnels(nd)
			if err == nil {
				err = ts.Add(other.PodCIDR4, other.IP4)
				ts.Close()
			}
			nd.Close()
			if err != nil {
				return crossPair{}, err
			}
		}
		var err error
		if lists[i], err = json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": "ebpf", "plugins": []any{p}}); err != nil {
			return crossPair{}, err
		}
	}
	if !overlay {
		if err := c.RouteDirect(); err != nil {
			return crossPair{}, err
		}
	}
	return b.crossAttach(c, path, EBPF, lists)
}

// crossRAW is a namespace behind each node, routed: no plugin, no rules.
func (b *bench) crossRAW(c *nettest.Cluster) (crossPair, error) {
	if err := c.RouteDirect(); err != nil {
		return crossPair{}, err
	}
	var pods [2]*pod
	for i, n := range c.Nodes[:2] {
		podNS, err := b.newNS()
		if err != nil {
			return crossPair{}, err
		}
		host := n.PodCIDR4.IP.To4()
		gw := net.IPv4(host[0], host[1], host[2], 1).To4()
		ip := net.IPv4(host[0], host[1], host[2], 2).To4()
		if err := n.NS.Do(func(ns.NetNS) error {
			_, err := sysctl.Sysctl("net/ipv4/ip_forward", "1")
			return err
		}); err != nil {
			return crossPair{}, err
		}
		if err := veth(n.NS, podNS, "rawpod", &net.IPNet{IP: gw, Mask: net.CIDRMask(24, 32)}, &net.IPNet{IP: ip, Mask: net.CIDRMask(24, 32)}, true); err != nil {
			return crossPair{}, err
		}
		pods[i] = &pod{ns: podNS, ip: ip}
	}
	return crossPair{pods[0], pods[1]}, nil
}

// masqueradeServices is the masquerade path on fresh REF and EBPF nodes
// whose netfilter holds benchServices Services laid out as kube-proxy's
// iptables mode does; RAW is masquerade's routed namespace.
func (b *bench) masqueradeServices() error {
	path := "masquerade-services"
	b.logf("%s: %d rounds of RR and TCP, %d of CRR, %d kube-proxy Services installed", path, b.cfg.runs, b.cfg.crrRounds, benchServices)
	ss := b.pick(path, "masq", p2pMetrics, true)
	var cs []clientServer
	for _, s := range ss {
		var client *pod
		world := s.node.World
		if s.name == RAW {
			var err error
			if client, err = b.rawRouted(); err != nil {
				return err
			}
			if err := b.ensureWorldServers(s); err != nil {
				return err
			}
		} else {
			fresh, err := b.newSetup(s.name, "svc")
			if err != nil {
				return err
			}
			subnet := refSubnet
			if s.name == EBPF {
				subnet = ebpfSubnet
			}
			k := kubeProxyServices(subnet, benchServices)
			if err := k.Install(fresh.node.NS, nettest.ModeIPTables); err != nil {
				return fmt.Errorf("%s: installing the Services: %w", s.name, err)
			}
			if s.name == EBPF {
				if err := b.leaseTranslated(fresh, k); err != nil {
					return err
				}
			}
			if client, _, err = b.addPod(fresh, nil); err != nil {
				return err
			}
			world = fresh.node.World
			if err := b.startServer(world, addr(nettest.WorldIP4, echoPort)); err != nil {
				return err
			}
			if err := b.startIperf(world, nettest.WorldIP4, iperfPort); err != nil {
				return err
			}
		}
		cs = append(cs, clientServer{s.name, client.ns, world, nettest.WorldIP4, echoPort})
	}
	return b.traffic(path, cs, true)
}

// kubeProxyServices is n Services (ClusterIP 10.96.0.0/16 and a NodePort,
// two endpoints each in the pod subnet), as kube-proxy writes them.
func kubeProxyServices(podSubnet string, n int) *nettest.KubeProxy {
	_, pods, _ := net.ParseCIDR(podSubnet)
	_, svcs, _ := net.ParseCIDR("10.96.0.0/16")
	k := &nettest.KubeProxy{ClusterCIDR: pods, ServiceCIDR: svcs, NodeIPs: []net.IP{nettest.NodeIP4}}
	base := pods.IP.To4()
	for i := 0; i < n; i++ {
		ep := func(j int) nettest.Endpoint {
			return nettest.Endpoint{IP: net.IPv4(base[0], base[1], byte(200+j), byte(i%250+1)), Port: 8080}
		}
		k.Services = append(k.Services, &nettest.Service{Namespace: "bench", Name: fmt.Sprintf("svc%d", i), PortName: "http", Protocol: "tcp",
			ClusterIP: net.IPv4(10, 96, byte(i/250), byte(i%250+1)), Port: 80, NodePort: 30000 + i,
			Endpoints: []nettest.Endpoint{ep(0), ep(1)}})
	}
	return k
}
