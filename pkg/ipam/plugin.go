package ipam

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/ebpf-cni/ebpf-cni/pkg/errcode"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// Funcs are the CNI verbs of ebpf-ipam, for skel.PluginMainFuncs.
func Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: CmdAdd, Del: CmdDel, Check: CmdCheck, GC: CmdGC, Status: CmdStatus}
}

// Versions lists every CNI spec version ebpf-ipam speaks.
var Versions = version.All

// withStore parses the configuration (all of it, or only what locates the
// state when full is false), opens the network's store with its lock held
// (creating it only for ADD: see OpenExisting), and runs fn.
func withStore(args *skel.CmdArgs, full, create bool, fn func(*Store, *Config, *NetConf) error) error {
	parse := ParseConfig
	if !full {
		parse = func(stdin []byte, _ string) (*Config, *NetConf, error) { return ParseDelConfig(stdin) }
	}
	c, n, err := parse(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	open := OpenExisting
	if create {
		open = Open
	}
	s, err := open(c)
	if err != nil {
		return err
	}
	defer s.Close()
	return fn(s, c, n)
}

// CmdAdd allocates and prints the result in the configuration's version.
func CmdAdd(args *skel.CmdArgs) error {
	res, cniVersion, err := Add(args)
	if err != nil {
		return err
	}
	return types.PrintResult(res, cniVersion)
}

// Add allocates and returns the result, with the configuration's
// cniVersion to print it in: CmdAdd, and ebpf-cni's in-process IPAM.
func Add(args *skel.CmdArgs) (res *current.Result, cniVersion string, err error) {
	err = withStore(args, true, true, func(s *Store, c *Config, _ *NetConf) error {
		err := s.claimRanges(c)
		var ips []*current.IPConfig
		if err == nil {
			ips, err = AllocateIn(s, c, args.ContainerID, args.IfName, args.Netns)
		}
		if err != nil {
			_, _ = s.Forget() // a failed ADD on a new network leaves nothing of it
			return err
		}
		res = &current.Result{CNIVersion: current.ImplementedSpecVersion, IPs: ips, Routes: c.Routes, DNS: c.DNS}
		cniVersion = c.CNIVersion
		return nil
	})
	return res, cniVersion, err
}

// CmdDel releases what the attachment holds; it is idempotent. Without
// bpffs it releases the attachment's record alone and succeeds (see
// ReleaseWithoutMaps).
func CmdDel(args *skel.CmdArgs) error {
	c, _, err := ParseDelConfig(args.StdinData)
	if err != nil {
		return err
	}
	if maps.CheckBPFFS(c.BPFRoot) != nil {
		if err := ReleaseWithoutMaps(c, args.ContainerID, args.IfName); err != nil {
			var e *types.Error
			if errors.As(err, &e) {
				return e
			}
			return stateError("stateDir", fmt.Errorf("releasing %s/%s without bpffs: %w", args.ContainerID, args.IfName, err))
		}
		return nil
	}
	return withStore(args, false, false, func(s *Store, _ *Config, _ *NetConf) error {
		if err := ReleaseAttachment(s, args.ContainerID, args.IfName); err != nil {
			return types.NewError(types.ErrIOFailure, fmt.Sprintf("releasing %s/%s", args.ContainerID, args.IfName), err.Error())
		}
		// The network's last address gone, its bookkeeping goes too.
		if _, err := s.Forget(); err != nil {
			return types.NewError(types.ErrIOFailure, fmt.Sprintf("forgetting network %q after its last address", s.Network), err.Error())
		}
		return nil
	})
}

// CmdCheck verifies the attachment's allocation against the state and
// against prevResult.
func CmdCheck(args *skel.CmdArgs) error {
	return withStore(args, true, false, func(s *Store, c *Config, n *NetConf) error {
		var prev *current.Result
		if n.RawPrevResult != nil {
			conf := &types.NetConf{CNIVersion: n.CNIVersion, RawPrevResult: n.RawPrevResult}
			if err := version.ParsePrevResult(conf); err != nil {
				return types.NewError(types.ErrDecodingFailure, "decoding prevResult", err.Error())
			}
			var err error
			if prev, err = current.NewResultFromResult(conf.PrevResult); err != nil {
				return types.NewError(types.ErrDecodingFailure, "converting prevResult", err.Error())
			}
		}
		return CheckAttachment(s, c, args.ContainerID, args.IfName, prev)
	})
}

// CmdGC releases every allocation of the network not listed in
// cni.dev/valid-attachments, then forgets the network if that was all it
// held, and every other network of the node that holds nothing (Sweep).
func CmdGC(args *skel.CmdArgs) error {
	c, _, err := ParseDelConfig(args.StdinData)
	if err != nil {
		return err
	}
	err = withStore(args, false, false, func(s *Store, _ *Config, n *NetConf) error {
		if _, err := GarbageCollect(s, n.ValidAttachments); err != nil {
			return types.NewError(types.ErrIOFailure, "garbage-collecting allocations", err.Error())
		}
		if _, err := s.Forget(); err != nil {
			return types.NewError(types.ErrIOFailure, fmt.Sprintf("forgetting network %q", s.Network), err.Error())
		}
		return nil
	})
	if err != nil {
		return err
	}
	if _, err := Sweep(c.BPFRoot, c.StateDir); err != nil {
		return types.NewError(types.ErrIOFailure, "forgetting the networks without addresses", err.Error())
	}
	return nil
}

// CmdStatus reports whether the plugin can serve an ADD now: state usable and
// a free address in every range set. Whatever keeps an ADD from succeeding
// but the configuration itself (codes 1, 6, 7) is code 50, the spec's "not
// available": bpffs or stateDir unusable, a pinned map of another layout,
// the network's ID taken by another network, resolvConf unreadable.
func CmdStatus(args *skel.CmdArgs) error {
	args.Args = "" // STATUS has no attachment, so no requested addresses
	if c, _, err := ParseDelConfig(args.StdinData); err == nil {
		// STATUS creates no network state, but ADD will need the directory.
		if err := os.MkdirAll(filepath.Join(c.StateDir, "ipam"), 0o700); err != nil {
			return types.NewError(types.ErrPluginNotAvailable, "ebpf-ipam is not available: "+stateError("stateDir", err).(*types.Error).Msg, "")
		}
	}
	err := withStore(args, true, false, func(s *Store, c *Config, _ *NetConf) error {
		all, err := s.allEntries()
		if err != nil {
			return types.NewError(types.ErrPluginNotAvailable, "ebpf-ipam is not available: reading the allocation map", err.Error())
		}
		if err := s.room(len(all)); err != nil {
			var e *types.Error
			if errors.As(err, &e) {
				return types.NewError(types.ErrPluginNotAvailable, "ebpf-ipam is not available: "+e.Msg, "")
			}
			return types.NewError(types.ErrPluginNotAvailable, "ebpf-ipam is not available: reading its maps", err.Error())
		}
		used, size := usage(s.entriesOf(all), c)
		for i := range c.RangeSets {
			if used[i] >= size[i] {
				return types.NewError(types.ErrPluginNotAvailable, fmt.Sprintf("ebpf-ipam is not available: no free address in range set %d (%s): %d of %d in use", i, describeSet(c.RangeSets[i]), used[i], size[i]), "")
			}
		}
		// ADD would refuse ranges another network holds addresses in.
		ce, err := sharedRange(c, s.Network)
		if err != nil {
			return types.NewError(types.ErrPluginNotAvailable, "ebpf-ipam is not available: reading the other networks' ranges", err.Error())
		}
		if ce != nil {
			return types.NewError(types.ErrPluginNotAvailable, "ebpf-ipam is not available: "+ce.Error(), "")
		}
		return nil
	})
	var e *types.Error
	if errors.As(err, &e) {
		switch e.Code {
		case errcode.StateUnavailable, errcode.NetworkIDClash, types.ErrIOFailure:
			return types.NewError(types.ErrPluginNotAvailable, "ebpf-ipam is not available: "+e.Msg, e.Details)
		}
	}
	return err
}
