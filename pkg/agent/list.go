package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// The informers of pods and NetworkPolicies read their list as it comes,
// each object turned into its record as soon as it is read.
//
// A reflector's list holds the whole list, read and decoded, until its
// store is replaced: its first list asks for resourceVersion "0", which the
// API server serves from its watch cache in one response, whatever the
// page size. At 30,000 pods that response is 108 MB of protobuf and 290
// MB of decoded Pods (their managed fields included): the heap grew to 430
// MB at each start of an agent whose records take 8 MB, and the runtime
// kept part of it long after (make scale, docs/scale.md). Read as a
// stream, the list holds the records and one object.
//
// Not in pages: pages are read at the latest resource version or at an
// exact one, which the API server reads from etcd unless its etcd reports
// its progress; 60 pages of 500 pods took 10 s where one response from
// the watch cache takes 1 s (make scale's etcd 3.4). Where the API server
// streams the initial list instead (WatchList), the reflector does not
// list at all: its objects become records one by one as they arrive.

// protobufMagic starts a response in protobuf (k8s.io/apimachinery's
// protobuf serializer): a runtime.Unknown follows, the list in its Raw.
var protobufMagic = []byte("k8s\x00")

// recordList is a list of records: what a records informer's list
// returns to its reflector (meta.ExtractList reads Items).
type recordList struct {
	metav1.TypeMeta
	metav1.ListMeta
	Items []runtime.Object
}

// GetObjectKind: a list of records has no kind (the reflector does not
// ask).
func (l *recordList) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject copies the list and its records.
func (l *recordList) DeepCopyObject() runtime.Object {
	c := &recordList{TypeMeta: l.TypeMeta, Items: make([]runtime.Object, len(l.Items))}
	l.ListMeta.DeepCopyInto(&c.ListMeta)
	for i, o := range l.Items {
		c.Items[i] = o.DeepCopyObject()
	}
	return c
}

// recordSource is how a resource is listed as records.
type recordSource struct {
	resource string         // its name in the API (pods)
	rest     rest.Interface // its group's client; nil: list only
	// list is the typed client's list: for a response that is not
	// protobuf, and a client without a REST client (a fake clientset).
	list func(context.Context, metav1.ListOptions) (runtime.Object, error)
	// record is the record of an object, decode of an object's protobuf.
	record func(runtime.Object) (runtime.Object, error)
	decode func([]byte) (runtime.Object, error)
}

// listRecords lists as the reflector asks (opts) and returns the records
// of the objects, each made as its object is read from the response.
func (s *recordSource) listRecords(ctx context.Context, opts metav1.ListOptions) (*recordList, error) {
	if c, ok := s.rest.(*rest.RESTClient); s.rest == nil || ok && c == nil {
		return s.listAll(ctx, opts)
	}
	body, err := s.rest.Get().UseProtobufAsDefault().Resource(s.resource).VersionedParams(&opts, scheme.ParameterCodec).Stream(ctx)
	if err != nil {
		return nil, err
	}
	defer body.Close()
	br := bufio.NewReaderSize(body, 64<<10)
	if magic, err := br.Peek(len(protobufMagic)); err != nil || !bytes.Equal(magic, protobufMagic) {
		return s.listAll(ctx, opts) // JSON: an API server that does not speak protobuf
	}
	_, _ = br.Discard(len(protobufMagic))
	out := &recordList{}
	lm, err := readProtobufList(br, func(raw []byte) error {
		r, err := s.decode(raw)
		if err != nil {
			return err
		}
		out.Items = append(out.Items, r)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading the list of %s: %w", s.resource, err)
	}
	out.ListMeta = lm
	return out, nil
}

// listAll is the list of the typed client, decoded whole, as records.
func (s *recordSource) listAll(ctx context.Context, opts metav1.ListOptions) (*recordList, error) {
	l, err := s.list(ctx, opts)
	if err != nil {
		return nil, err
	}
	lm, err := meta.ListAccessor(l)
	if err != nil {
		return nil, err
	}
	out := &recordList{ListMeta: metav1.ListMeta{ResourceVersion: lm.GetResourceVersion(), Continue: lm.GetContinue(), RemainingItemCount: lm.GetRemainingItemCount()}}
	err = meta.EachListItem(l, func(o runtime.Object) error {
		r, err := s.record(o)
		if err == nil {
			out.Items = append(out.Items, r)
		}
		return err
	})
	return out, err
}

// readProtobufList reads a list in protobuf after its magic: a
// runtime.Unknown whose Raw (field 2) is the list, whose ListMeta is its
// field 1 and each item a field 2. item is called with each item's
// encoding (a buffer reused for the next).
func readProtobufList(r *bufio.Reader, item func([]byte) error) (metav1.ListMeta, error) {
	var lm metav1.ListMeta
	var buf []byte
	top := &protobufReader{r: r, left: -1}
	err := top.fields(func(field uint64, unknown *protobufReader) error {
		if field != 2 { // TypeMeta, ContentEncoding, ContentType
			return nil
		}
		return unknown.fields(func(field uint64, f *protobufReader) error {
			var err error
			switch field {
			case 1:
				if buf, err = f.bytes(buf); err == nil {
					err = lm.Unmarshal(buf)
				}
			case 2:
				if buf, err = f.bytes(buf); err == nil {
					err = item(buf)
				}
			}
			return err
		})
	})
	return lm, err
}

// protobufReader reads a protobuf message from r: left bytes of it (-1:
// up to the end of r).
type protobufReader struct {
	r    *bufio.Reader
	left int64
}

func (p *protobufReader) ReadByte() (byte, error) {
	if p.left == 0 {
		return 0, io.EOF
	}
	b, err := p.r.ReadByte()
	if err == nil && p.left > 0 {
		p.left--
	}
	return b, err
}

func (p *protobufReader) skip(n int64) error {
	if p.left >= 0 && n > p.left {
		return io.ErrUnexpectedEOF
	}
	for n > 0 {
		k := int(min(n, 1<<30))
		d, err := p.r.Discard(k)
		if p.left > 0 {
			p.left -= int64(d)
		}
		if err != nil {
			return noEOF(err)
		}
		n -= int64(d)
	}
	return nil
}

// bytes reads the rest of the message into buf (grown as needed).
func (p *protobufReader) bytes(buf []byte) ([]byte, error) {
	if p.left < 0 {
		return nil, errors.New("a field of unknown length")
	}
	if int64(cap(buf)) < p.left {
		buf = make([]byte, p.left)
	}
	buf = buf[:p.left]
	if _, err := io.ReadFull(p.r, buf); err != nil {
		return nil, noEOF(err)
	}
	p.left = 0
	return buf, nil
}

// fields calls fn with each length-delimited field of the message and a
// reader of its bytes (what fn leaves unread is skipped); the other
// fields are skipped.
func (p *protobufReader) fields(fn func(field uint64, f *protobufReader) error) error {
	for {
		tag, err := binary.ReadUvarint(p)
		if err == io.EOF {
			return nil // the end, between two fields
		}
		if err != nil {
			return noEOF(err)
		}
		switch tag & 7 {
		case 0: // varint
			_, err = binary.ReadUvarint(p)
		case 1: // 64-bit
			err = p.skip(8)
		case 5: // 32-bit
			err = p.skip(4)
		case 2: // length-delimited
			var n uint64
			if n, err = binary.ReadUvarint(p); err != nil {
				return noEOF(err)
			}
			if p.left >= 0 && n > uint64(p.left) || n > 1<<31 {
				return fmt.Errorf("a field of %d bytes in a message of %d", n, p.left)
			}
			f := &protobufReader{r: p.r, left: int64(n)}
			if err = fn(tag>>3, f); err == nil {
				err = f.skip(f.left)
			}
			if p.left > 0 {
				p.left -= int64(n)
			}
		default:
			return fmt.Errorf("protobuf wire type %d", tag&7)
		}
		if err != nil {
			return noEOF(err)
		}
	}
}

// noEOF: an end in the middle of a message is an unexpected one.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// recordsInformer is an informer of src's records, its list listRecords',
// its watch watchFn's (its objects made records by the informer's
// transform, slim), indexed by namespace. client tells the reflector
// whether it can stream the initial list (a fake clientset cannot).
func recordsInformer(client kubernetes.Interface, example runtime.Object, src *recordSource, watchFn cache.WatchFuncWithContext) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return src.listRecords(ctx, opts)
		},
		WatchFuncWithContext: watchFn,
	}
	return cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, client), example,
		cache.SharedIndexInformerOptions{Indexers: cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}})
}

// podSource lists the pods of the cluster as podRecords.
func podSource(client kubernetes.Interface) *recordSource {
	pods := client.CoreV1().Pods(metav1.NamespaceAll)
	record := func(o runtime.Object) (runtime.Object, error) {
		p, ok := o.(*corev1.Pod)
		if !ok {
			return nil, fmt.Errorf("listing pods: got a %T", o)
		}
		return recordOf(p), nil
	}
	return &recordSource{resource: "pods", rest: client.CoreV1().RESTClient(), record: record,
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return pods.List(ctx, o) },
		decode: func(raw []byte) (runtime.Object, error) {
			var p corev1.Pod
			if err := p.Unmarshal(raw); err != nil {
				return nil, fmt.Errorf("a pod: %w", err)
			}
			return recordOf(&p), nil
		}}
}

// policySource lists the NetworkPolicies of the cluster as policyRecords.
func policySource(client kubernetes.Interface) *recordSource {
	pols := client.NetworkingV1().NetworkPolicies(metav1.NamespaceAll)
	record := func(o runtime.Object) (runtime.Object, error) {
		p, ok := o.(*networkingv1.NetworkPolicy)
		if !ok {
			return nil, fmt.Errorf("listing network policies: got a %T", o)
		}
		return policyRecordOf(p)
	}
	return &recordSource{resource: "networkpolicies", rest: client.NetworkingV1().RESTClient(), record: record,
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return pols.List(ctx, o) },
		decode: func(raw []byte) (runtime.Object, error) {
			var p networkingv1.NetworkPolicy
			if err := p.Unmarshal(raw); err != nil {
				return nil, fmt.Errorf("a network policy: %w", err)
			}
			return policyRecordOf(&p)
		}}
}

// podInformer is factory's informer of every pod of the cluster, kept as
// podRecords.
func podInformer(factory informers.SharedInformerFactory) cache.SharedIndexInformer {
	return factory.InformerFor(&corev1.Pod{}, func(client kubernetes.Interface, _ time.Duration) cache.SharedIndexInformer {
		return recordsInformer(client, &corev1.Pod{}, podSource(client), client.CoreV1().Pods(metav1.NamespaceAll).Watch)
	})
}

// policyInformer is factory's informer of every NetworkPolicy of the
// cluster, kept as policyRecords.
func policyInformer(factory informers.SharedInformerFactory) cache.SharedIndexInformer {
	return factory.InformerFor(&networkingv1.NetworkPolicy{}, func(client kubernetes.Interface, _ time.Duration) cache.SharedIndexInformer {
		return recordsInformer(client, &networkingv1.NetworkPolicy{}, policySource(client), client.NetworkingV1().NetworkPolicies(metav1.NamespaceAll).Watch)
	})
}
