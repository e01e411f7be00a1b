package plugin

import (
	"context"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ipam"
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

// Delegate is the IPAM step the verbs use: by default the plugin the
// configuration names (ipam.type), run as the CNI spec says.
var Delegate IPAM = execIPAM{}

// execIPAM runs the IPAM plugin as a child process.
type execIPAM struct{}

func (execIPAM) Add(c *Config) (types.Result, error) { return ipam.ExecAdd(c.IPAMType, c.IPAMConf) }
func (execIPAM) Del(c *Config) error                 { return ipam.ExecDel(c.IPAMType, c.IPAMConf) }
func (execIPAM) Check(c *Config) error               { return ipam.ExecCheck(c.IPAMType, c.IPAMConf) }
func (execIPAM) Status(c *Config) error              { return ipam.ExecStatus(c.IPAMType, c.IPAMConf) }
func (execIPAM) GC(c *Config) error {
	return invoke.DelegateGC(context.TODO(), c.IPAMType, c.IPAMConf, nil)
}
