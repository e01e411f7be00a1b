package features

import (
	"errors"

	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// InOrder runs each for every feature in ADD order (i indexes
// All and Config.Pods) and core, the endpoint's step, at its
// place: after Before, before After. It stops at the
// first error.
func InOrder(core func() error, each func(i int, f feature.Feature) error) error {
	for i, f := range Before {
		if err := each(i, f); err != nil {
			return err
		}
	}
	if err := core(); err != nil {
		return err
	}
	for j, f := range After {
		if err := each(len(Before)+j, f); err != nil {
			return err
		}
	}
	return nil
}

// InReverse is InOrder backwards (DEL), and runs every step whatever the
// others return: it gives their errors joined.
func InReverse(core func() error, each func(f feature.Feature) error) error {
	var errs []error
	for j := len(After) - 1; j >= 0; j-- {
		errs = append(errs, each(After[j]))
	}
	errs = append(errs, core())
	for i := len(Before) - 1; i >= 0; i-- {
		errs = append(errs, each(Before[i]))
	}
	return errors.Join(errs...)
}

// Release takes every feature's node-wide state away (programs on the
// node's devices and cgroup, node settings): the node has no endpoint
// left, and the caller holds the node lock exclusively
// (node.ReleaseIfEmpty). Best effort: every feature's runs; GC retries
// what fails.
func Release(n *node.Node) error {
	var errs []error
	for _, f := range All {
		errs = append(errs, f.Release(n))
	}
	return errors.Join(errs...)
}
