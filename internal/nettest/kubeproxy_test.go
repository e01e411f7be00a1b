package nettest

import (
	"net"
	"os"
	"strings"
	"testing"
)

func sampleProxy(v6 bool) *KubeProxy {
	p := func(s string) net.IP { return net.ParseIP(s) }
	if !v6 {
		return &KubeProxy{ClusterCIDR: ClusterCIDR4, ServiceCIDR: mustCIDR("10.96.0.0/16"), NodeIPs: []net.IP{p("192.0.2.11")},
			Services: []*Service{
				{Namespace: "default", Name: "web", PortName: "http", Protocol: "tcp", ClusterIP: p("10.96.0.10"), Port: 80, NodePort: 30080,
					ExternalIPs: []net.IP{p("198.51.100.200")}, Endpoints: []Endpoint{{p("10.244.1.2"), 8080}, {p("10.244.2.2"), 8080}}},
				{Namespace: "kube-system", Name: "dns", PortName: "dns", Protocol: "udp", ClusterIP: p("10.96.0.53"), Port: 53,
					Endpoints: []Endpoint{{p("10.244.1.3"), 53}}},
				{Namespace: "default", Name: "empty", PortName: "p", Protocol: "tcp", ClusterIP: p("10.96.0.99"), Port: 81},
			}}
	}
	return &KubeProxy{ClusterCIDR: ClusterCIDR6, ServiceCIDR: mustCIDR("fd00:96::/112"), NodeIPs: []net.IP{p("2001:db8:1::11")},
		Services: []*Service{{Namespace: "default", Name: "web", PortName: "http", Protocol: "tcp", ClusterIP: p("fd00:96::10"), Port: 80, NodePort: 30080,
			Endpoints: []Endpoint{{p("fd00:244:0:1::2"), 8080}, {p("fd00:244:0:2::2"), 8080}}}}}
}

// TestKubeProxyRules: the fixtures are what iptables-restore and nft
// accept, in both families, and carry kube-proxy's landmarks.
func TestKubeProxyRules(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	for _, mode := range []ProxyMode{ModeIPTables, ModeNFTables} {
		for _, v6 := range []bool{false, true} {
			n, err := NewNetNS()
			if err != nil {
				t.Fatal(err)
			}
			k := sampleProxy(v6)
			if err := k.Install(n, mode); err != nil {
				CloseNetNS(n)
				t.Fatalf("%s v6=%v: %v", mode, v6, err)
			}
			// A second sync replaces the first.
			if mode == ModeNFTables {
				if err := k.Install(n, mode); err != nil {
					CloseNetNS(n)
					t.Fatalf("%s v6=%v again: %v", mode, v6, err)
				}
			}
			show := []string{"nft", "list", "ruleset"}
			if mode == ModeIPTables {
				show = []string{"iptables-save"}
				if v6 {
					show = []string{"ip6tables-save"}
				}
			}
			out, err := Run(n, show[0], show[1:]...)
			CloseNetNS(n)
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"numgen random mod 2", "masquerade fully-random", "service-ips", "service-nodeports"}
			if mode == ModeIPTables {
				want = []string{"KUBE-SVC-", "KUBE-SEP-", "KUBE-EXT-", "--mode random --probability 0.50000000000", "--random-fully", "--ctstate INVALID -j DROP", "MARK --set-xmark 0x4000/0x4000"}
			}
			for _, w := range want {
				if !strings.Contains(out, w) {
					t.Errorf("%s v6=%v: the ruleset lacks %q:\n%s", mode, v6, w, out)
				}
			}
		}
	}
}
