package nettest

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Rule sets shaped like kube-proxy's own, for both of its netfilter modes,
// generated the way kube-proxy lays them out (pkg/proxy/iptables and
// pkg/proxy/nftables of Kubernetes): the tests and the bench install them
// in a node's netns instead of running kube-proxy. What they have of it:
//
//   - iptables: nat KUBE-SERVICES (a rule per ClusterIP and externalIP,
//     then the NodePort jump with addrtype LOCAL), KUBE-NODEPORTS,
//     KUBE-SVC-* (masquerade mark for sources outside the cluster's pod
//     ranges, endpoints chosen with statistic random probability),
//     KUBE-SEP-* (hairpin mark, DNAT), KUBE-EXT-* (mark, then the service),
//     KUBE-MARK-MASQ (0x4000), KUBE-POSTROUTING (MASQUERADE --random-fully
//     of marked packets); filter KUBE-FORWARD (ctstate INVALID dropped,
//     marked and established accepted), KUBE-SERVICES, KUBE-EXTERNAL-SERVICES,
//     KUBE-NODEPORTS, KUBE-PROXY-FIREWALL.
//   - nftables: table ip / ip6 kube-proxy with the service-ips and
//     service-nodeports verdict maps, cluster-ips and nodeport-ips sets,
//     service-* chains with the masquerade mark and numgen random mod N
//     vmap, endpoint-* chains with dnat, external-* chains,
//     mark-for-masquerade, masquerading (masquerade fully-random), and the
//     filter chains (cluster-ips-check, service-endpoints-check).
//
// Session affinity, load balancer source ranges, topology and traffic
// policy Local are left out: the datapath treats their flows like any other.

// Endpoint is one backend of a Service.
type Endpoint struct {
	IP   net.IP
	Port int
}

func (e Endpoint) String() string { return net.JoinHostPort(e.IP.String(), strconv.Itoa(e.Port)) }

// Service is one port of a Service, of one family (all addresses alike).
type Service struct {
	Namespace, Name string
	PortName        string // e.g. "p80"
	Protocol        string // "tcp" or "udp"
	ClusterIP       net.IP
	Port            int
	NodePort        int // 0: none
	ExternalIPs     []net.IP
	Endpoints       []Endpoint
}

func (s *Service) portName() string { return s.Namespace + "/" + s.Name + ":" + s.PortName }

func (s *Service) v6() bool { return s.ClusterIP.To4() == nil }

// KubeProxy is one node's kube-proxy: its settings, and its Services.
type KubeProxy struct {
	// ClusterCIDR is the cluster's pod range of the family (--cluster-cidr):
	// sources outside it are masqueraded.
	ClusterCIDR *net.IPNet
	// ServiceCIDR is the Service range of the family (nftables drops
	// traffic to unallocated ClusterIPs in it).
	ServiceCIDR *net.IPNet
	// NodeIPs are the node's addresses of the family (nftables nodeport-ips;
	// iptables matches addrtype LOCAL).
	NodeIPs  []net.IP
	Services []*Service
}

// hash is kube-proxy's chain-name hash: base32 of sha256, truncated.
func hash(s string, n int) string {
	sum := sha256.Sum256([]byte(s))
	return base32.StdEncoding.EncodeToString(sum[:])[:n]
}

func (k *KubeProxy) v6() bool { return k.ClusterCIDR.IP.To4() == nil }

func hostPort(ip net.IP, port int) string { return net.JoinHostPort(ip.String(), strconv.Itoa(port)) }

// IPTables is the input of iptables-restore (or ip6tables-restore) for the
// rule set, filter and nat tables, without flushing anything else.
func (k *KubeProxy) IPTables() string {
	var f, n strings.Builder
	w := func(b *strings.Builder, format string, a ...any) { fmt.Fprintf(b, format+"\n", a...) }
	w(&f, "*filter")
	for _, c := range []string{"KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-NODEPORTS", "KUBE-PROXY-FIREWALL", "KUBE-SERVICES"} {
		w(&f, ":%s - [0:0]", c)
	}
	w(&f, `-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL`)
	w(&f, `-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS`)
	w(&f, `-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES`)
	w(&f, `-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL`)
	w(&f, `-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD`)
	w(&f, `-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
	w(&f, `-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES`)
	w(&f, `-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL`)
	w(&f, `-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
	w(&f, `-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP`)
	w(&f, `-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT`)
	w(&f, `-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`)

	w(&n, "*nat")
	chains := []string{"KUBE-MARK-MASQ", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-SERVICES"}
	var rules strings.Builder
	for _, s := range k.Services {
		spn, proto := s.portName(), s.Protocol
		h := hash(spn+proto, 16)
		svc, ext := "KUBE-SVC-"+h, "KUBE-EXT-"+h
		chains = append(chains, svc)
		match := fmt.Sprintf("-m %s -p %s", proto, proto)
		w(&rules, `-A KUBE-SERVICES -m comment --comment "%s cluster IP" %s -d %s --dport %d -j %s`, spn, match, s.ClusterIP, s.Port, svc)
		hasExt := s.NodePort != 0 || len(s.ExternalIPs) > 0
		if hasExt {
			chains = append(chains, ext)
			for _, e := range s.ExternalIPs {
				w(&rules, `-A KUBE-SERVICES -m comment --comment "%s external IP" %s -d %s --dport %d -j %s`, spn, match, e, s.Port, ext)
			}
			if s.NodePort != 0 {
				w(&rules, `-A KUBE-NODEPORTS -m comment --comment %s %s --dport %d -j %s`, spn, match, s.NodePort, ext)
			}
			w(&rules, `-A %s -m comment --comment "masquerade traffic for %s external destinations" -j KUBE-MARK-MASQ`, ext, spn)
			w(&rules, `-A %s -j %s`, ext, svc)
		}
		w(&rules, `-A %s -m comment --comment "%s cluster IP" %s -d %s --dport %d ! -s %s -j KUBE-MARK-MASQ`, svc, spn, match, s.ClusterIP, s.Port, k.ClusterCIDR)
		for i, e := range s.Endpoints {
			sep := "KUBE-SEP-" + hash(spn+proto+e.String(), 16)
			chains = append(chains, sep)
			stat := ""
			if left := len(s.Endpoints) - i; left > 1 {
				stat = fmt.Sprintf(" -m statistic --mode random --probability %0.10f", 1/float64(left))
			}
			w(&rules, `-A %s -m comment --comment "%s -> %s"%s -j %s`, svc, spn, e, stat, sep)
			w(&rules, `-A %s -m comment --comment %s -s %s -j KUBE-MARK-MASQ`, sep, spn, e.IP)
			w(&rules, `-A %s -m comment --comment %s %s -j DNAT --to-destination %s`, sep, spn, match, e)
		}
		if len(s.Endpoints) == 0 {
			w(&f, `-A KUBE-SERVICES -m comment --comment "%s has no endpoints" %s -d %s --dport %d -j REJECT`, spn, match, s.ClusterIP, s.Port)
		}
	}
	for _, c := range chains {
		w(&n, ":%s - [0:0]", c)
	}
	w(&n, `-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
	w(&n, `-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
	w(&n, `-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING`)
	w(&n, `-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN`)
	w(&n, `-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000`)
	w(&n, `-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`)
	w(&n, `-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000`)
	n.WriteString(rules.String())
	w(&n, `-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS`)
	w(&f, "COMMIT")
	w(&n, "COMMIT")
	return f.String() + n.String()
}

// NFTables is the input of nft -f for the rule set: the table of the
// family (ip or ip6 kube-proxy), made afresh.
func (k *KubeProxy) NFTables() string {
	fam, addr, ipkw := "ip", "ipv4_addr", "ip"
	if k.v6() {
		fam, addr, ipkw = "ip6", "ipv6_addr", "ip6"
	}
	var b strings.Builder
	t := fam + " kube-proxy"
	k.nftBase(&b, t, addr, ipkw)
	for _, ip := range k.NodeIPs {
		fmt.Fprintf(&b, "add element %s nodeport-ips { %s }\n", t, ip)
	}
	for _, s := range k.Services {
		k.nftService(&b, t, ipkw, s)
	}
	return b.String()
}

// nftBase writes table t afresh with what every node has, Services or
// not: its sets, maps and chains, the base chains' hooks and their rules.
// addr is the family's address type, ipkw its keyword in a match.
func (k *KubeProxy) nftBase(b *strings.Builder, t, addr, ipkw string) {
	w := func(format string, a ...any) {
		fmt.Fprintf(b, format+"\n", a...)
	}
	w(`add table %s { comment "rules for kube-proxy" ; }`, t)
	w(`delete table %s`, t) // a fresh table, as kube-proxy's first sync
	w(`add table %s { comment "rules for kube-proxy" ; }`, t)
	w(`add set %s cluster-ips { type %s ; comment "Active ClusterIPs" ; }`, t, addr)
	w(`add set %s nodeport-ips { type %s ; comment "IPs that accept NodePort traffic" ; }`, t, addr)
	w(`add map %s firewall-ips { type %s . inet_proto . inet_service : verdict ; comment "destinations that are subject to LoadBalancerSourceRanges" ; }`, t, addr)
	w(`add map %s no-endpoint-nodeports { type inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }`, t)
	w(`add map %s no-endpoint-services { type %s . inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }`, t, addr)
	w(`add map %s service-ips { type %s . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }`, t, addr)
	w(`add map %s service-nodeports { type inet_proto . inet_service : verdict ; comment "NodePort traffic" ; }`, t)
	for _, c := range []string{"cluster-ips-check", "firewall-check", "mark-for-masquerade", "masquerading", "nodeport-endpoints-check", "services", "service-endpoints-check"} {
		w(`add chain %s %s`, t, c)
	}
	w(`add chain %s reject-chain { comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }`, t)
	w(`add chain %s filter-prerouting-pre-dnat { type filter hook prerouting priority -110 ; }`, t)
	w(`add chain %s filter-output-pre-dnat { type filter hook output priority -110 ; }`, t)
	w(`add chain %s filter-forward { type filter hook forward priority 0 ; }`, t)
	w(`add chain %s filter-input { type filter hook input priority 0 ; }`, t)
	w(`add chain %s filter-output { type filter hook output priority 0 ; }`, t)
	w(`add chain %s nat-output { type nat hook output priority -100 ; }`, t)
	w(`add chain %s nat-postrouting { type nat hook postrouting priority 100 ; }`, t)
	w(`add chain %s nat-prerouting { type nat hook prerouting priority -100 ; }`, t)
	w(`add rule %s cluster-ips-check %s daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"`, t, ipkw)
	w(`add rule %s cluster-ips-check %s daddr { %s } drop comment "Drop traffic to unallocated ClusterIPs"`, t, ipkw, k.ServiceCIDR)
	w(`add rule %s filter-prerouting-pre-dnat ct state new jump firewall-check`, t)
	w(`add rule %s filter-forward ct state new jump service-endpoints-check`, t)
	w(`add rule %s filter-forward ct state new jump cluster-ips-check`, t)
	w(`add rule %s filter-input ct state new jump nodeport-endpoints-check`, t)
	w(`add rule %s filter-input ct state new jump service-endpoints-check`, t)
	w(`add rule %s filter-output ct state new jump service-endpoints-check`, t)
	w(`add rule %s filter-output-pre-dnat ct state new jump firewall-check`, t)
	w(`add rule %s filter-output ct state new jump cluster-ips-check`, t)
	w(`add rule %s firewall-check %s daddr . meta l4proto . th dport vmap @firewall-ips`, t, ipkw)
	w(`add rule %s mark-for-masquerade mark set mark or 0x4000`, t)
	w(`add rule %s masquerading mark and 0x4000 == 0 return`, t)
	w(`add rule %s masquerading mark set mark xor 0x4000`, t)
	w(`add rule %s masquerading masquerade fully-random`, t)
	w(`add rule %s nat-output jump services`, t)
	w(`add rule %s nat-postrouting jump masquerading`, t)
	w(`add rule %s nat-prerouting jump services`, t)
	w(`add rule %s nodeport-endpoints-check %s daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports`, t, ipkw)
	w(`add rule %s reject-chain reject`, t)
	w(`add rule %s services %s daddr . meta l4proto . th dport vmap @service-ips`, t, ipkw)
	w(`add rule %s services %s daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports`, t, ipkw)
	w(`add rule %s service-endpoints-check %s daddr . meta l4proto . th dport vmap @no-endpoint-services`, t, ipkw)
}

// nftService writes Service s into table t: its service chain with the
// masquerade mark and the random choice of an endpoint chain (or a reject
// without endpoints), its addresses in the maps, and its external chain
// for a NodePort or an externalIP.
func (k *KubeProxy) nftService(b *strings.Builder, t, ipkw string, s *Service) {
	w := func(format string, a ...any) {
		fmt.Fprintf(b, format+"\n", a...)
	}
	spn := s.Namespace + "/" + s.Name + "/" + s.Protocol + "/" + s.PortName
	h := hash(s.portName()+s.Protocol, 8)
	svc, ext := "service-"+h+"-"+spn, "external-"+h+"-"+spn
	w(`add chain %s %s`, t, svc)
	w(`add rule %s %s %s daddr %s %s saddr != %s jump mark-for-masquerade`, t, svc, ipkw, s.ClusterIP, ipkw, k.ClusterCIDR)
	var vmap []string
	for i, e := range s.Endpoints {
		// nft names take no colons: kube-proxy writes an IPv6 endpoint with dots.
		ep := fmt.Sprintf("endpoint-%s-%s__%s/%d", hash(s.portName()+s.Protocol+e.String(), 8), spn,
			strings.ReplaceAll(e.IP.String(), ":", "."), e.Port)
		w(`add chain %s %s`, t, ep)
		w(`add rule %s %s %s saddr %s jump mark-for-masquerade`, t, ep, ipkw, e.IP)
		to := e.IP.String()
		if s.v6() {
			to = "[" + to + "]"
		}
		w(`add rule %s %s meta l4proto %s dnat to %s:%d`, t, ep, s.Protocol, to, e.Port)
		vmap = append(vmap, fmt.Sprintf("%d : goto %s", i, ep))
	}
	if len(vmap) > 0 {
		w(`add rule %s %s numgen random mod %d vmap { %s }`, t, svc, len(vmap), strings.Join(vmap, " , "))
	} else {
		w(`add element %s no-endpoint-services { %s . %s . %d comment "%s" : goto reject-chain }`, t, s.ClusterIP, s.Protocol, s.Port, s.portName())
	}
	w(`add element %s cluster-ips { %s }`, t, s.ClusterIP)
	w(`add element %s service-ips { %s . %s . %d : goto %s }`, t, s.ClusterIP, s.Protocol, s.Port, svc)
	if s.NodePort != 0 || len(s.ExternalIPs) > 0 {
		w(`add chain %s %s`, t, ext)
		w(`add rule %s %s jump mark-for-masquerade`, t, ext)
		w(`add rule %s %s goto %s`, t, ext, svc)
		for _, e := range s.ExternalIPs {
			w(`add element %s service-ips { %s . %s . %d : goto %s }`, t, e, s.Protocol, s.Port, ext)
		}
		if s.NodePort != 0 {
			w(`add element %s service-nodeports { %s . %d : goto %s }`, t, s.Protocol, s.NodePort, ext)
		}
	}
}

// ProxyMode is kube-proxy's netfilter mode.
type ProxyMode string

// The modes the fixtures write.
const (
	ModeIPTables ProxyMode = "iptables"
	ModeNFTables ProxyMode = "nftables"
)

// Install loads the rule set into netns n in mode: iptables-restore (or
// ip6tables-restore) --noflush, or nft -f.
func (k *KubeProxy) Install(n ns.NetNS, mode ProxyMode) error {
	var cmd *exec.Cmd
	switch mode {
	case ModeIPTables:
		tool := "iptables-restore"
		if k.v6() {
			tool = "ip6tables-restore"
		}
		cmd = exec.Command(tool, "--noflush")
		cmd.Stdin = strings.NewReader(k.IPTables())
	case ModeNFTables:
		cmd = exec.Command("nft", "-f", "-")
		cmd.Stdin = strings.NewReader(k.NFTables())
	default:
		return fmt.Errorf("unknown kube-proxy mode %q", mode)
	}
	return n.Do(func(ns.NetNS) error {
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w: %s", cmd, err, out)
		}
		return nil
	})
}

// APIObjects are k's Services as the API server holds them (one object per
// Namespace/Name: its ClusterIP, externalIPs) and a Node of the name with
// NodeIPs as its InternalIPs: what the node agent reads to keep the
// destinations kube-proxy translates (agent.XlatSet).
func (k *KubeProxy) APIObjects(nodeName string) ([]*corev1.Service, []*corev1.Node) {
	byName := map[string]*corev1.Service{}
	var svcs []*corev1.Service
	for _, s := range k.Services {
		key := s.Namespace + "/" + s.Name
		o := byName[key]
		if o == nil {
			o = &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name},
				Spec: corev1.ServiceSpec{ClusterIP: s.ClusterIP.String(), ClusterIPs: []string{s.ClusterIP.String()}}}
			byName[key] = o
			svcs = append(svcs, o)
		}
		for _, ip := range s.ExternalIPs {
			if !slices.Contains(o.Spec.ExternalIPs, ip.String()) {
				o.Spec.ExternalIPs = append(o.Spec.ExternalIPs, ip.String())
			}
		}
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}
	for _, ip := range k.NodeIPs {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip.String()})
	}
	return svcs, []*corev1.Node{n}
}
