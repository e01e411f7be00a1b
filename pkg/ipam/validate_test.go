package ipam

import (
	"net"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// testNode stands for the node's addresses in the unit tests: they must
// not depend on the machine's.
var testNode = []NodeNet{
	{Net: net.IPNet{IP: net.ParseIP("198.51.100.7").To4(), Mask: net.CIDRMask(24, 32)}, Iface: "uplink"},
	{Net: net.IPNet{IP: net.ParseIP("2001:db8:5::7"), Mask: net.CIDRMask(64, 128)}, Iface: "uplink"},
}

func init() {
	nodeNets = func() ([]NodeNet, error) { return testNode, nil }
}

// Every hostile range and requested address, IPv4 and IPv6: code 7,
// naming the key. (test/ipam runs the same through the binary and checks
// nothing is left behind.)
func TestHostileRangesAndAddresses(t *testing.T) {
	for _, tc := range []struct {
		name, ipam, args, key string
	}{
		{"0.0.0.0/0", `"ranges":[[{"subnet":"0.0.0.0/0"}]]`, "", "ipam.ranges[0][0].subnet"},
		{"::/0", `"ranges":[[{"subnet":"10.9.0.0/24"}],[{"subnet":"fd09::/64"},{"subnet":"::/0"}]]`, "", "ipam.ranges[1][1].subnet"},
		{"this network", `"subnet":"0.1.0.0/16"`, "", "ipam.subnet"},
		{"loopback", `"ranges":[[{"subnet":"127.0.0.0/24"}]]`, "", "ipam.ranges[0][0].subnet"},
		{"loopback6", `"ranges":[[{"subnet":"::/120"}]]`, "", "ipam.ranges[0][0].subnet"},
		{"multicast", `"ranges":[[{"subnet":"224.0.0.0/24"}]]`, "", "ipam.ranges[0][0].subnet"},
		{"multicast6", `"ranges":[[{"subnet":"ff02::/64"}]]`, "", "ipam.ranges[0][0].subnet"},
		{"link-local", `"ranges":[[{"subnet":"169.254.1.0/24"}]]`, "", "ipam.ranges[0][0].subnet"},
		{"link-local6", `"ranges":[[{"subnet":"fe80::/64"}]]`, "", "ipam.ranges[0][0].subnet"},
		{"reserved", `"ranges":[[{"subnet":"240.0.0.0/24"}]]`, "", "ipam.ranges[0][0].subnet"},
		{"ipv4-mapped", `"ranges":[[{"subnet":"::ffff:10.0.0.0/120"}]]`, "", "ipam.ranges[0][0].subnet"},
		{"node subnet", `"ranges":[[{"subnet":"198.51.100.0/25"}]]`, "", "ipam.ranges[0][0].subnet"},
		{"node subnet inside", `"ranges":[[{"subnet":"198.51.0.0/16"}]]`, "", "ipam.ranges[0][0].subnet"},
		{"node subnet6", `"ranges":[[{"subnet":"2001:db8:5::/56"}]]`, "", "ipam.ranges[0][0].subnet"},
		{"ipRanges too", `"subnet":"10.9.0.0/24"},"runtimeConfig":{"ipRanges":[[{"subnet":"127.0.0.0/8"}]]`, "", "runtimeConfig.ipRanges[0][0].subnet"},

		{"requested loopback", `"subnet":"10.9.0.0/24"},"runtimeConfig":{"ips":["127.0.0.1"]`, "", "runtimeConfig.ips"},
		{"requested multicast", `"subnet":"10.9.0.0/24"`, "IP=224.0.0.1", "CNI_ARGS IP"},
		{"requested pods' gateway", `"subnet":"10.9.0.0/24"},"args":{"cni":{"ips":["169.254.1.1"]}`, "", "args.cni.ips"},
		{"requested node address", `"subnet":"10.9.0.0/24"`, "IP=198.51.100.7", "CNI_ARGS IP"},
		{"requested node address6", `"ranges":[[{"subnet":"fd09::/64"}]]},"runtimeConfig":{"ips":["2001:db8:5::7"]`, "", "runtimeConfig.ips"},
		{"requested network address", `"subnet":"10.9.0.0/24"`, "IP=10.9.0.0", "CNI_ARGS IP"},
		{"requested broadcast", `"subnet":"10.9.0.0/24"`, "IP=10.9.0.255", "CNI_ARGS IP"},
		{"requested default gateway", `"subnet":"10.9.0.0/24"`, "IP=10.9.0.1", "CNI_ARGS IP"},
		{"requested gateway", `"subnet":"10.9.0.0/24","gateway":"10.9.0.9"},"runtimeConfig":{"ips":["10.9.0.9"]`, "", "runtimeConfig.ips"},
		{"requested network address6", `"ranges":[[{"subnet":"fd09::/64"}]]`, "IP=fd09::", "CNI_ARGS IP"},
		{"requested gateway6", `"ranges":[[{"subnet":"fd09::/64"}]]`, "IP=fd09::1", "CNI_ARGS IP"},
		{"requested unspecified6", `"ranges":[[{"subnet":"fd09::/64"}]]`, "IP=::", "CNI_ARGS IP"},
		{"requested link-local6", `"ranges":[[{"subnet":"fd09::/64"}]]`, "IP=fe80::1", "CNI_ARGS IP"},
		{"requested v4-mapped", `"subnet":"10.9.0.0/24"`, "IP=::ffff:10.9.0.5", "CNI_ARGS IP"},
		{"requested v4-mapped runtimeConfig", `"subnet":"10.9.0.0/24"},"runtimeConfig":{"ips":["::ffff:10.9.0.5/24"]`, "", "runtimeConfig.ips"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdin := conf(tc.ipam)
			_, _, err := ParseConfig(stdin, tc.args)
			e, ok := err.(*types.Error)
			if !ok {
				t.Fatalf("%s: want code 7, got %v", stdin, err)
			}
			if e.Code != types.ErrInvalidNetworkConfig || !strings.Contains(e.Msg, tc.key) {
				t.Fatalf("want code 7 naming %s, got %d: %s", tc.key, e.Code, e.Msg)
			}
		})
	}
}

// The ranges next to the hostile ones are fine.
func TestUsualRangesPass(t *testing.T) {
	for _, ipam := range []string{
		`"ranges":[[{"subnet":"10.244.0.0/16"}],[{"subnet":"fd00:244::/64"}]]`,
		`"subnet":"198.51.101.0/24"`, `"subnet":"1.0.0.0/24"`, `"subnet":"223.255.255.0/24"`,
		`"ranges":[[{"subnet":"2001:db8:6::/64"}]]`, `"ranges":[[{"subnet":"fe00::/64"}]]`,
	} {
		if _, _, err := ParseConfig(conf(ipam), ""); err != nil {
			t.Errorf("%s: %v", ipam, err)
		}
	}
}

func TestCheckResult(t *testing.T) {
	ipc := func(cidr, gw string) *current.IPConfig {
		ip, n, _ := net.ParseCIDR(cidr)
		return &current.IPConfig{Address: net.IPNet{IP: ip, Mask: n.Mask}, Gateway: net.ParseIP(gw)}
	}
	good := []*current.IPConfig{ipc("10.88.0.5/16", "10.88.0.1"), ipc("fd88::5/64", "fd88::1")}
	if err := checkResult(good, testNode); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []*current.IPConfig{
		ipc("0.0.0.2/0", ""), ipc("127.0.0.1/8", ""), ipc("224.0.0.1/24", ""), ipc("169.254.1.1/16", ""),
		ipc("198.51.100.7/24", ""), ipc("198.51.100.9/24", ""), ipc("10.88.0.0/16", ""), ipc("10.88.255.255/16", ""),
		ipc("10.88.0.1/16", "10.88.0.1"), ipc("::2/0", ""), ipc("fe80::5/64", ""), ipc("ff02::1/64", ""), ipc("2001:db8:5::9/64", ""),
	} {
		err := checkResult([]*current.IPConfig{good[0], bad}, testNode)
		e, ok := err.(*types.Error)
		if !ok || e.Code != types.ErrInvalidNetworkConfig || !strings.Contains(e.Msg, "ipam result ips[1].address") {
			t.Errorf("%s gw %s: want code 7 naming ips[1], got %v", &bad.Address, bad.Gateway, err)
		}
	}
}

// A bridge with isGateway holds the range's gateway on the node: that one
// address of the node may be in the range's subnet, no other.
func TestNodeMayHoldTheGateway(t *testing.T) {
	node := append([]NodeNet{{Net: net.IPNet{IP: net.ParseIP("10.77.0.1").To4(), Mask: net.CIDRMask(24, 32)}, Iface: "ebr0"}}, testNode...)
	nodeNets = func() ([]NodeNet, error) { return node, nil }
	t.Cleanup(func() { nodeNets = func() ([]NodeNet, error) { return testNode, nil } })
	if _, _, err := ParseConfig(conf(`"subnet":"10.77.0.0/24"`), ""); err != nil {
		t.Fatalf("the default gateway on the node: %v", err)
	}
	_, _, err := ParseConfig(conf(`"subnet":"10.77.0.0/24","gateway":"10.77.0.9"`), "")
	if e, ok := err.(*types.Error); !ok || e.Code != types.ErrInvalidNetworkConfig || !strings.Contains(e.Msg, "ipam.subnet") {
		t.Fatalf("a node address in the range that is not its gateway: want code 7, got %v", err)
	}
	_, _, err = ParseConfig(conf(`"subnet":"10.77.0.0/24"`), "IP=10.77.0.1")
	if e, ok := err.(*types.Error); !ok || e.Code != types.ErrInvalidNetworkConfig {
		t.Fatalf("requesting the gateway: want code 7, got %v", err)
	}
}
