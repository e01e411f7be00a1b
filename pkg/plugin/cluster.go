package plugin

import (
	"errors"
	"net"

	"github.com/ebpf-cni/ebpf-cni/pkg/cluster"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/flows"
	"github.com/ebpf-cni/ebpf-cni/pkg/nat"
)

// The cluster feature (pkg/cluster): the cluster's pod ranges
// (clusterCIDRs), the VXLAN overlay, and the flow table that lets
// kube-proxy's netfilter see the flows it translates (pkg/flows). Each
// function below is one step of a verb.

// ErrCluster: the cluster's ranges or the overlay could not be set up; a
// bad key is code 7 instead.
const ErrCluster uint = 122

// clusterKeys names the embedded cluster.Config in NetConf (nat.Config is
// a Config too).
type clusterKeys = cluster.Config

// clusterParse validates the cluster keys; the cluster's ranges are never
// masqueraded.
func clusterParse(c *Config) error {
	s, err := c.NetConf.clusterKeys.Validate()
	if err != nil {
		return clusterError(err)
	}
	c.Cluster = s
	if c.Masq != nil {
		c.Masq.Cluster = s.Ranges
	}
	return nil
}

// clusterMTU is the pods' MTU with the overlay's overhead taken off when
// the configuration names none.
func clusterMTU(c *Config, mtu int) int {
	if c.MTU == 0 && c.Cluster.Enabled() && c.Cluster.VXLAN {
		return mtu - cluster.Overhead()
	}
	return mtu
}

// clusterAdd marks the cluster's ranges, gives the uplinks their programs
// (packets routed to the node's pods go straight in) and makes the
// overlay. The node's last endpoint undoes it (releaseNode); so does a
// failed first ADD.
func clusterAdd(c *Config, progs *datapath.Programs, undo *[]func(), lock *datapath.Lock) error {
	if !c.Cluster.Enabled() {
		return nil
	}
	*undo = append(*undo, func() { releaseNode(c, lock) })
	if err := cluster.AddRanges(c.BPFRoot, c.StateDir, c.Cluster.Ranges); err != nil {
		return clusterError(err)
	}
	if err := nat.EnsureUplinks(c.BPFRoot, c.StateDir, c.Masq.Uplinks, c.Mode, progs); err != nil {
		return clusterError(err)
	}
	if c.Cluster.VXLAN {
		if err := cluster.EnsureOverlay(c.BPFRoot, c.StateDir, c.Cluster, c.Mode, progs); err != nil {
			return clusterError(err)
		}
	}
	return nil
}

// clusterCheck names what is missing of the cluster's state.
func clusterCheck(c *Config) []string {
	if !c.Cluster.Enabled() {
		return nil
	}
	problems := cluster.MissingRanges(c.BPFRoot, c.Cluster.Ranges)
	if c.Cluster.VXLAN {
		p, err := datapath.OpenPrograms(c.BPFRoot, datapath.Tag())
		if err != nil {
			return append(problems, err.Error())
		}
		defer p.Close()
		problems = append(problems, cluster.OverlayProblems(c.BPFRoot, c.Cluster, p)...)
	}
	return problems
}

// clusterRelease undoes the node-wide state with the node's last endpoint.
func clusterRelease(c *Config) error {
	return cluster.Release(c.BPFRoot, c.StateDir)
}

// flowsFlush deletes the pod's flows: a pod that gets its address later
// inherits no verdict.
func flowsFlush(bpfRoot string, ips []net.IP) error {
	if len(ips) == 0 {
		return nil
	}
	t, err := flows.Open(bpfRoot)
	if err != nil {
		return err
	}
	defer t.Close()
	_, err = t.FlushPod(ips)
	return err
}

// flowsGC deletes the flows of pods that are gone.
func flowsGC(bpfRoot string, live func(net.IP) bool) error {
	t, err := flows.Open(bpfRoot)
	if err != nil {
		return err
	}
	defer t.Close()
	_, err = t.GC(live)
	return err
}

// clusterError turns a cluster error into a CNI error: a bad key is an
// invalid configuration that names it.
func clusterError(err error) error {
	var ce *cluster.ConfigError
	var ne *nat.ConfigError
	switch {
	case errors.As(err, &ce):
		return invalidConfig(ce.Key, ce.Msg)
	case errors.As(err, &ne):
		return invalidConfig(ne.Key, ne.Msg)
	}
	return cniError(ErrCluster, "setting up the cluster's routing", err)
}
