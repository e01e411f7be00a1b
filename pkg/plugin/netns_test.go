package plugin

import (
	"errors"
	"os"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
)

// netnsIno is the inode of the calling thread's network namespace.
func netnsIno(t *testing.T) uint64 {
	var st unix.Stat_t
	require.NoError(t, unix.Stat(ownNetNS, &st))
	return st.Ino
}

// podNetNS.Do runs the callback in the pod's namespace with the node's as
// its argument, comes back to the node's, and hands the callback's error
// back; its handle on the node's is opened once and closed with the pod's.
func TestPodNetNSDo(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	pod, err := nettest.NewNetNS()
	require.NoError(t, err)
	defer nettest.CloseNetNS(pod)
	podIno := func() uint64 {
		var st unix.Stat_t
		require.NoError(t, unix.Stat(pod.Path(), &st))
		return st.Ino
	}()
	p, err := openNetNS(pod.Path())
	require.NoError(t, err)
	nodeIno := netnsIno(t)
	require.NotEqual(t, nodeIno, podIno)

	var node ns.NetNS
	for range 3 {
		var in, arg uint64
		require.NoError(t, p.Do(func(n ns.NetNS) error {
			in = netnsIno(t)
			var st unix.Stat_t
			require.NoError(t, unix.Fstat(int(n.Fd()), &st))
			arg = st.Ino
			if node == nil {
				node = n
			}
			require.Same(t, node, n, "one handle on the node's netns for every Do")
			return nil
		}))
		require.Equal(t, podIno, in, "the callback runs in the pod's netns")
		require.Equal(t, nodeIno, arg, "its argument is the node's netns")
		require.Equal(t, nodeIno, netnsIno(t), "back in the node's after Do")
	}
	boom := errors.New("boom")
	require.ErrorIs(t, p.Do(func(ns.NetNS) error { return boom }), boom)
	require.NoError(t, p.Close())
	var st unix.Stat_t
	require.Error(t, unix.Fstat(int(node.Fd()), &st), "Close closes the node's handle too")
}
