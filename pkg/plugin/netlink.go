package plugin

import (
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
)

func netlinkLinkByName(name string) (netlink.Link, error) { return netlinksafe.LinkByName(name) }
