package events

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
)

// PodDev is a device of a pod's network namespace (its inode number);
// Ifindex 0 stands for every device of the namespace without its own entry.
type PodDev = KfreeSkbPodDevKey

// Tracer reports the kernel's drops of pods' packets into the stream
// (bpf/kfree_skb.c) while it is attached.
type Tracer struct {
	objs KfreeSkbObjects
	link link.Link
	devs map[PodDev]uint32
}

// TraceKernelDrops loads and attaches the tracer against the stream's
// maps. It needs the kfree_skb tracepoint with its reason (Linux 5.17) and
// the kernel's BTF.
func (s *Stream) TraceKernelDrops() (*Tracer, error) {
	spec, err := LoadKfreeSkb()
	if err != nil {
		return nil, err
	}
	t := &Tracer{devs: map[PodDev]uint32{}}
	opts := &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{
		KfreeSkbMapEvents: s.ring, KfreeSkbMapEventsConfig: s.config, KfreeSkbMapEventsStats: s.stats,
	}}
	if err := spec.LoadAndAssign(&t.objs, opts); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("verifying the kfree_skb tracer: %+v", ve)
		}
		return nil, fmt.Errorf("loading the kfree_skb tracer: %w", err)
	}
	t.link, err = link.AttachTracing(link.TracingOptions{Program: t.objs.KfreeSkb})
	if err != nil {
		t.objs.Close()
		return nil, fmt.Errorf("attaching to the kfree_skb tracepoint: %w", err)
	}
	return t, nil
}

// SetPods replaces the pods' devices the tracer reports drops of (device
// -> the pod's host veth ifindex).
func (t *Tracer) SetPods(devs map[PodDev]uint32) error {
	m := t.objs.PodDevs
	for k := range t.devs {
		if _, ok := devs[k]; !ok {
			if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return err
			}
		}
	}
	for k, v := range devs {
		if t.devs[k] != v {
			if err := m.Put(k, v); err != nil {
				return err
			}
		}
	}
	t.devs = devs
	return nil
}

// Close detaches the tracer.
func (t *Tracer) Close() error {
	err := t.link.Close()
	return errors.Join(err, t.objs.Close())
}

// KernelReasons names the running kernel's enum skb_drop_reason values
// (NO_SOCKET, NETFILTER_DROP, ...): they differ between kernels.
func KernelReasons() (map[uint32]string, error) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return nil, err
	}
	var e *btf.Enum
	if err := spec.TypeByName("skb_drop_reason", &e); err != nil {
		return nil, err
	}
	out := map[uint32]string{}
	for _, v := range e.Values {
		out[uint32(v.Value)] = strings.TrimPrefix(strings.TrimPrefix(v.Name, "SKB_DROP_REASON_"), "SKB_")
	}
	return out, nil
}
