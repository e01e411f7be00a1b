package agent

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/cache"
)

// TestReadProtobufList: a list in protobuf, as the API server sends it,
// read item by item: every pod of the list becomes its record, the list's
// resource version is read, fields unknown are skipped, and a response
// cut short fails.
func TestReadProtobufList(t *testing.T) {
	list := &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "4711", Continue: "next"}}
	for i := range 50 {
		p := testPod(fmt.Sprint("ns-", i%7), fmt.Sprint("pod-", i), fmt.Sprintf("10.0.%d.%d", i/200, i%200), map[string]string{"app": fmt.Sprint("a", i%3)})
		p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet", FieldsV1: &metav1.FieldsV1{Raw: bytes.Repeat([]byte("x"), 1000)}}}
		p.Spec.Containers = []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: int32(8000 + i)}}}}
		list.Items = append(list.Items, *p)
	}
	var body bytes.Buffer
	require.NoError(t, protobuf.NewSerializer(scheme.Scheme, scheme.Scheme).Encode(list, &body))
	require.True(t, bytes.HasPrefix(body.Bytes(), protobufMagic))
	src := podSource(fake.NewClientset())
	read := func(b []byte) ([]runtime.Object, metav1.ListMeta, error) {
		var got []runtime.Object
		lm, err := readProtobufList(bufio.NewReaderSize(bytes.NewReader(b[len(protobufMagic):]), 16), func(raw []byte) error {
			r, err := src.decode(raw)
			got = append(got, r)
			return err
		})
		return got, lm, err
	}
	got, lm, err := read(body.Bytes())
	require.NoError(t, err)
	require.Equal(t, "4711", lm.ResourceVersion)
	require.Equal(t, "next", lm.Continue)
	require.Len(t, got, len(list.Items))
	for i, o := range got {
		require.Equal(t, recordOf(&list.Items[i]), o, "pod %d", i)
	}
	_, _, err = read(body.Bytes()[:body.Len()-10])
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
}

// TestListRecordsFallback: a client without a REST client (a fake
// clientset) lists with its typed client, as records.
func TestListRecordsFallback(t *testing.T) {
	client := fake.NewClientset(testPod("a", "one", "10.0.0.1", nil), testPod("b", "two", "10.0.0.2", nil))
	l, err := podSource(client).listRecords(context.Background(), metav1.ListOptions{ResourceVersion: "0"})
	require.NoError(t, err)
	require.Len(t, l.Items, 2)
	objs, err := meta.ExtractListWithAlloc(l)
	require.NoError(t, err)
	require.Len(t, objs, 2, "what the reflector reads of the list")
	require.IsType(t, &podRecord{}, objs[0])
	require.Equal(t, l, l.DeepCopyObject())
}

// TestRecordsInformers: the informers of pods and policies keep records,
// from their list and from their watch.
func TestRecordsInformers(t *testing.T) {
	client := fake.NewSimpleClientset(testPod("a", "one", "10.0.0.1", map[string]string{"app": "x"}), denyEgress("a", "out", "x", "y", 53))
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(slim))
	pods, pols := podInformer(factory), policyInformer(factory)
	require.Same(t, pods, podInformer(factory), "one informer of a type per factory")
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	t.Cleanup(func() { cancel(); factory.Shutdown() })
	require.True(t, cache.WaitForCacheSync(ctx.Done(), pods.HasSynced, pols.HasSynced))

	rs, err := podIndex{pods.GetIndexer()}.of("a")
	require.NoError(t, err)
	require.Len(t, rs, 1)
	require.Equal(t, "one", rs[0].name)
	ps, err := policyIndex{pols.GetIndexer()}.of("a")
	require.NoError(t, err)
	require.Len(t, ps, 1)
	require.Equal(t, "out", ps[0].name)

	_, err = client.CoreV1().Pods("b").Create(ctx, testPod("b", "two", "10.0.0.2", nil), metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = client.NetworkingV1().NetworkPolicies("b").Create(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "b", Name: "deny"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		rs, _ := podIndex{pods.GetIndexer()}.of("b")
		ps, _ := policyIndex{pols.GetIndexer()}.of("b")
		return len(rs) == 1 && rs[0].name == "two" && len(ps) == 1 && ps[0].name == "deny"
	}, 10*time.Second, 10*time.Millisecond)
}
