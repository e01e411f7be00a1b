package plugin

import (
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	ebpfipam "github.com/ebpf-cni/ebpf-cni/pkg/ipam"
)

// IPAM is the IPAM step of the verbs: a seam, so that an allocator run in
// the plugin's own process can take the place of the delegated plugin, and
// a test can put its own (Config.IPAM). a is the attachment the step is
// for, with the call's CNI_ARGS and CNI_PATH: the verb's own arguments, or
// those of another attachment that healing releases. Its StdinData is not
// read: the IPAM configuration is c.IPAMConf.
type IPAM interface {
	Add(a *skel.CmdArgs, c *Config) (types.Result, error)
	Del(a *skel.CmdArgs, c *Config) error
	Check(a *skel.CmdArgs, c *Config) error
	Status(a *skel.CmdArgs, c *Config) error
	GC(a *skel.CmdArgs, c *Config) error
}

// ipam is the call's IPAM step: Config.IPAM, or by default ebpf-ipam's
// allocator in this process when the configuration names ebpf-ipam, and
// otherwise the plugin it names (ipam.type), run as the CNI spec says.
func (c *Config) ipam() IPAM {
	if c.IPAM != nil {
		return c.IPAM
	}
	if c.IPAMType == DefaultIPAM && os.Getenv(IPAMExecEnv) != "1" {
		return inProcessIPAM{}
	}
	return execIPAM{}
}

// IPAMExecEnv set to 1 makes ebpf-cni run ebpf-ipam as a child process
// like any other IPAM plugin (the in-process allocator is the same code,
// state and locks: this is for comparing the two).
const IPAMExecEnv = "EBPF_CNI_IPAM_EXEC"

// inProcessIPAM runs ebpf-ipam's verbs in this process: what exec costs
// (a second Go binary started, about 5 ms of every ADD and DEL) is saved;
// ebpf-ipam gets the arguments the child would have.
type inProcessIPAM struct{}

// ipamArgs are a's arguments with the IPAM configuration on "stdin".
func ipamArgs(a *skel.CmdArgs, c *Config) *skel.CmdArgs {
	b := *a
	b.StdinData = c.IPAMConf
	return &b
}

func (inProcessIPAM) Add(a *skel.CmdArgs, c *Config) (types.Result, error) {
	r, _, err := ebpfipam.Add(ipamArgs(a, c))
	if err != nil {
		return nil, err
	}
	return r, nil
}
func (inProcessIPAM) Del(a *skel.CmdArgs, c *Config) error { return ebpfipam.CmdDel(ipamArgs(a, c)) }
func (inProcessIPAM) Check(a *skel.CmdArgs, c *Config) error {
	return ebpfipam.CmdCheck(ipamArgs(a, c))
}
func (inProcessIPAM) Status(a *skel.CmdArgs, c *Config) error {
	return ebpfipam.CmdStatus(ipamArgs(a, c))
}
func (inProcessIPAM) GC(a *skel.CmdArgs, c *Config) error { return ebpfipam.CmdGC(ipamArgs(a, c)) }

// execIPAM runs the IPAM plugin as a child process (delegate.go).
type execIPAM struct{}

func (execIPAM) Add(a *skel.CmdArgs, c *Config) (types.Result, error) {
	out, err := delegate("ADD", a, c.IPAMType, c.IPAMConf)
	if err != nil {
		return nil, err
	}
	return delegatedResult(c.IPAMConf, out)
}
func (execIPAM) Del(a *skel.CmdArgs, c *Config) error    { return delegateNoResult("DEL", a, c) }
func (execIPAM) Check(a *skel.CmdArgs, c *Config) error  { return delegateNoResult("CHECK", a, c) }
func (execIPAM) Status(a *skel.CmdArgs, c *Config) error { return delegateNoResult("STATUS", a, c) }
func (execIPAM) GC(a *skel.CmdArgs, c *Config) error     { return delegateNoResult("GC", a, c) }

func delegateNoResult(verb string, a *skel.CmdArgs, c *Config) error {
	_, err := delegate(verb, a, c.IPAMType, c.IPAMConf)
	return err
}
