package bandwidth

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/config"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

func entry(t *testing.T, s string) *Entry {
	t.Helper()
	if s == "" {
		return nil
	}
	e := &Entry{}
	require.NoError(t, json.Unmarshal([]byte(s), e))
	return e
}

func TestValidate(t *testing.T) {
	for _, c := range []struct {
		name, top, rt string
		want          Limits
		badKey        string
	}{
		{name: "nothing"},
		{name: "zeros mean no limit", rt: `{"ingressRate":0,"ingressBurst":0}`},
		{name: "runtime", rt: `{"egressRate":20000000,"egressBurst":100000,"ingressRate":50000000,"ingressBurst":200000}`,
			want: Limits{Egress: Limit{Rate: 20e6, Burst: 100000}, Ingress: Limit{Rate: 50e6, Burst: 200000}}},
		{name: "top level wins", top: `{"egressRate":1000000,"egressBurst":8000}`, rt: `{"egressRate":20000000,"egressBurst":100000}`,
			want: Limits{Egress: Limit{Rate: 1e6, Burst: 8000}}},
		{name: "exponent", rt: `{"egressRate":1e9,"egressBurst":1e7}`, want: Limits{Egress: Limit{Rate: 1e9, Burst: 1e7}}},
		// Each runtime's "no burst": kubelet, containerd's annotations,
		// CRI-O now and before, math.MaxUint64; and anything above.
		{name: "kubelet burst", rt: `{"egressRate":20000000,"egressBurst":2147483647}`,
			want: Limits{Egress: Limit{Rate: 20e6, Burst: 4e6, DefaultBurst: true}}},
		{name: "containerd burst", rt: `{"ingressRate":10000000,"ingressBurst":4294967295,"egressRate":20000000,"egressBurst":4294967295}`,
			want: Limits{Ingress: Limit{Rate: 10e6, Burst: 2e6, DefaultBurst: true}, Egress: Limit{Rate: 20e6, Burst: 4e6, DefaultBurst: true}}},
		{name: "cri-o burst", rt: `{"ingressRate":10000000,"ingressBurst":34359738367}`,
			want: Limits{Ingress: Limit{Rate: 10e6, Burst: 2e6, DefaultBurst: true}}},
		{name: "older cri-o burst", rt: `{"ingressRate":10000000,"ingressBurst":34359738360}`,
			want: Limits{Ingress: Limit{Rate: 10e6, Burst: 2e6, DefaultBurst: true}}},
		{name: "uint64 burst", top: `{"egressRate":10000000,"egressBurst":18446744073709551615}`,
			want: Limits{Egress: Limit{Rate: 10e6, Burst: 2e6, DefaultBurst: true}}},
		{name: "burst beyond uint64", top: `{"egressRate":10000000,"egressBurst":1e30}`,
			want: Limits{Egress: Limit{Rate: 10e6, Burst: 2e6, DefaultBurst: true}}},
		{name: "largest burst kept", rt: `{"egressRate":20000000,"egressBurst":2147483646}`,
			want: Limits{Egress: Limit{Rate: 20e6, Burst: 2147483646}}},
		{name: "default burst of a fast rate", rt: `{"egressRate":100000000000,"egressBurst":4294967295}`,
			want: Limits{Egress: Limit{Rate: 1e11, Burst: 2e10, DefaultBurst: true}}},
		{name: "rate without burst", rt: `{"ingressRate":1000000}`, badKey: "runtimeConfig.bandwidth.ingressBurst"},
		{name: "burst without rate", rt: `{"egressBurst":1000000}`, badKey: "runtimeConfig.bandwidth.egressRate"},
		{name: "negative rate", rt: `{"egressRate":-5,"egressBurst":1000}`, badKey: "runtimeConfig.bandwidth.egressRate"},
		{name: "negative burst", top: `{"ingressRate":5000,"ingressBurst":-1}`, badKey: "ingressBurst"},
		{name: "fraction", rt: `{"egressRate":1000.5,"egressBurst":1000}`, badKey: "runtimeConfig.bandwidth.egressRate"},
		{name: "rate too low", rt: `{"egressRate":999,"egressBurst":1000}`, badKey: "runtimeConfig.bandwidth.egressRate"},
		{name: "rate too high", rt: `{"egressRate":1000000000001,"egressBurst":1000}`, badKey: "runtimeConfig.bandwidth.egressRate"},
	} {
		t.Run(c.name, func(t *testing.T) {
			top := entry(t, c.top)
			if top == nil {
				top = &Entry{}
			}
			l, err := Validate(top, entry(t, c.rt))
			if c.badKey != "" {
				var ce *config.Error
				require.ErrorAs(t, err, &ce)
				require.Equal(t, c.badKey, ce.Key, ce.Msg)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, *l)
		})
	}
}

func TestBucket(t *testing.T) {
	b := bucket(Limit{Rate: 8_000_000, Burst: 8_000_000}, false) // 1 MB/s, 1 s of burst
	require.Equal(t, uint64(1000)<<maps.CniBwConstBW_NS_SHIFT, b.NsPerByte)
	require.Equal(t, uint64(1e9), b.Tau)
	huge := bucket(Limit{Rate: MinRate, Burst: maxBurstBits}, true)
	require.Equal(t, uint64(maxBurstBits)*1_000_000, huge.Tau, "128-bit product, no wrap")
	require.Equal(t, uint64(maps.CniBwFlagsBW_F_EDT), huge.Flags)
	require.Zero(t, bucket(Limit{}, false).NsPerByte, "no limit")
	require.Equal(t, uint32(6), (&Limits{Egress: Limit{Rate: 1}, Ingress: Limit{Rate: 1}}).Flags())
}
