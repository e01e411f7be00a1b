package plugin

import (
	"errors"

	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
)

// inOrder runs each for every feature in ADD order (i indexes
// features.All and Config.Pods) and core, the endpoint's step, at its
// place: after features.Before, before features.After. It stops at the
// first error.
func inOrder(core func() error, each func(i int, f feature.Feature) error) error {
	for i, f := range features.Before {
		if err := each(i, f); err != nil {
			return err
		}
	}
	if err := core(); err != nil {
		return err
	}
	for j, f := range features.After {
		if err := each(len(features.Before)+j, f); err != nil {
			return err
		}
	}
	return nil
}

// inReverse is inOrder backwards (DEL), and runs every step whatever the
// others return: it gives their errors joined.
func inReverse(core func() error, each func(f feature.Feature) error) error {
	var errs []error
	for j := len(features.After) - 1; j >= 0; j-- {
		errs = append(errs, each(features.After[j]))
	}
	errs = append(errs, core())
	for i := len(features.Before) - 1; i >= 0; i-- {
		errs = append(errs, each(features.Before[i]))
	}
	return errors.Join(errs...)
}
