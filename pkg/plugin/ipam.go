package plugin

import (
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	ebpfipam "github.com/ebpf-cni/ebpf-cni/pkg/ipam"
)

// IPAM is the IPAM step of the verbs: a seam, so that an allocator run in
// the plugin's own process can take the place of the delegated plugin.
type IPAM interface {
	Add(c *Config) (types.Result, error)
	Del(c *Config) error
	Check(c *Config) error
	Status(c *Config) error
	GC(c *Config) error
}

// Delegate is the IPAM step the verbs use: by default ebpf-ipam's allocator
// in this process when the configuration names ebpf-ipam, and otherwise
// the plugin it names (ipam.type), run as the CNI spec says.
var Delegate IPAM = defaultIPAM{}

// IPAMExecEnv set to 1 makes ebpf-cni run ebpf-ipam as a child process
// like any other IPAM plugin (the in-process allocator is the same code,
// state and locks: this is for comparing the two).
const IPAMExecEnv = "EBPF_CNI_IPAM_EXEC"

// defaultIPAM picks, per call, in-process ebpf-ipam or the exec protocol.
type defaultIPAM struct{}

func (defaultIPAM) pick(c *Config) IPAM {
	if c.IPAMType == DefaultIPAM && os.Getenv(IPAMExecEnv) != "1" {
		return inProcessIPAM{}
	}
	return execIPAM{}
}

func (d defaultIPAM) Add(c *Config) (types.Result, error) { return d.pick(c).Add(c) }
func (d defaultIPAM) Del(c *Config) error                 { return d.pick(c).Del(c) }
func (d defaultIPAM) Check(c *Config) error               { return d.pick(c).Check(c) }
func (d defaultIPAM) Status(c *Config) error              { return d.pick(c).Status(c) }
func (d defaultIPAM) GC(c *Config) error                  { return d.pick(c).GC(c) }

// inProcessIPAM runs ebpf-ipam's verbs in this process: what exec costs
// (a second Go binary started, about 5 ms of every ADD and DEL) is saved;
// the attachment's identity comes from the same CNI_* variables the child
// would read.
type inProcessIPAM struct{}

func ipamArgs(c *Config) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: os.Getenv("CNI_CONTAINERID"), Netns: os.Getenv("CNI_NETNS"), IfName: os.Getenv("CNI_IFNAME"),
		Args: os.Getenv("CNI_ARGS"), Path: os.Getenv("CNI_PATH"), StdinData: c.IPAMConf}
}

func (inProcessIPAM) Add(c *Config) (types.Result, error) {
	r, _, err := ebpfipam.Add(ipamArgs(c))
	if err != nil {
		return nil, err
	}
	return r, nil
}
func (inProcessIPAM) Del(c *Config) error    { return ebpfipam.CmdDel(ipamArgs(c)) }
func (inProcessIPAM) Check(c *Config) error  { return ebpfipam.CmdCheck(ipamArgs(c)) }
func (inProcessIPAM) Status(c *Config) error { return ebpfipam.CmdStatus(ipamArgs(c)) }
func (inProcessIPAM) GC(c *Config) error     { return ebpfipam.CmdGC(ipamArgs(c)) }

// execIPAM runs the IPAM plugin as a child process (delegate.go).
type execIPAM struct{}

func (execIPAM) Add(c *Config) (types.Result, error) {
	out, err := delegate("ADD", c.IPAMType, c.IPAMConf)
	if err != nil {
		return nil, err
	}
	return delegatedResult(c.IPAMConf, out)
}
func (execIPAM) Del(c *Config) error    { return delegateNoResult("DEL", c) }
func (execIPAM) Check(c *Config) error  { return delegateNoResult("CHECK", c) }
func (execIPAM) Status(c *Config) error { return delegateNoResult("STATUS", c) }
func (execIPAM) GC(c *Config) error     { return delegateNoResult("GC", c) }

func delegateNoResult(verb string, c *Config) error {
	_, err := delegate(verb, c.IPAMType, c.IPAMConf)
	return err
}
