package netpol_test

import (
	"testing"
	"time"
)

// TestNoPolicies: without any NetworkPolicy every pod reaches every pod on
// every served port and protocol, over IPv4 and IPv6: the probes work, and
// a node whose agent has nothing to enforce costs nothing in reachability.
func TestNoPolicies(t *testing.T) {
	cl := newCluster(t)
	var checks []check
	for _, port := range servedPorts {
		checks = append(checks, tcp(port, allowAll()), udp(port, allowAll()), sctp(port, allowAll()))
	}
	cl.expect(t, checks, time.Second)
}
