package ipam

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// firstOverlap finds a range of this network and one of another that share
// an address, whatever the order, the family mix or the ranges of one side
// that overlap each other; ranges that only touch do not overlap.
func TestFirstOverlap(t *testing.T) {
	spans := func(network string, lines ...string) []span {
		var out []span
		for i, l := range lines {
			r := parseRangeLine(l)
			require.NotNil(t, r, l)
			s := span{r: r, network: network}
			if network == "" {
				s.key = "k" + string(rune('0'+i))
			}
			out = append(out, s)
		}
		return out
	}
	for _, tc := range []struct {
		name          string
		mine, theirs  []string
		wantMine, net string
	}{
		{"same", []string{"10.0.0.1 10.0.0.254 10.0.0.0/24"}, []string{"10.0.0.1 10.0.0.254 10.0.0.0/24"}, "k0", "a"},
		{"touching", []string{"10.0.0.1 10.0.0.127 10.0.0.0/24"}, []string{"10.0.0.128 10.0.0.254 10.0.0.0/24"}, "", ""},
		{"one address", []string{"10.0.0.1 10.0.0.128 10.0.0.0/24"}, []string{"10.0.0.128 10.0.0.254 10.0.0.0/24"}, "k0", "a"},
		{"theirs first, mine inside a later one", []string{"fd00::1 fd00::ff fd00::/64", "10.9.0.5 10.9.0.6 10.9.0.0/24"},
			[]string{"10.0.0.1 10.0.0.254 10.0.0.0/24", "10.9.0.1 10.9.0.254 10.9.0.0/24"}, "k1", "a"},
		{"other family only", []string{"fd00::1 fd00::ff fd00::/64"}, []string{"10.0.0.1 10.0.0.254 10.0.0.0/24"}, "", ""},
		{"a long range of mine before", []string{"10.0.0.1 10.255.255.254 10.0.0.0/8"}, []string{"10.200.0.1 10.200.0.2 10.200.0.0/24"}, "k0", "a"},
		{"mine overlap each other only", []string{"10.0.0.1 10.0.0.254 10.0.0.0/24", "10.0.0.9 10.0.0.10 10.0.0.0/24"}, []string{"10.1.0.1 10.1.0.254 10.1.0.0/24"}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := firstOverlap(spans("", tc.mine...), spans("a", tc.theirs...))
			if tc.wantMine == "" {
				require.Nil(t, a)
				return
			}
			require.NotNil(t, a)
			require.Equal(t, tc.wantMine, a.key)
			require.Equal(t, tc.net, b.network)
		})
	}
	require.Nil(t, parseRangeLine("10.0.0.1 fd00::1 10.0.0.0/24"), "one family per range")
	require.Nil(t, parseRangeLine("garbage"))
}
