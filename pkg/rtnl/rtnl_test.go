package rtnl

import (
	"os"
	"runtime"
	"testing"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
)

func linkNames(t *testing.T, h *netlinksafe.Handle) []string {
	t.Helper()
	links, err := h.LinkList()
	require.NoError(t, err)
	var names []string
	for _, l := range links {
		names = append(names, l.Attrs().Name)
	}
	return names
}

// A span keeps one socket per namespace, each bound to the namespace it
// was made in; outside a span every request has its own socket.
func TestSpan(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	node, err := nettest.NewNetNS()
	require.NoError(t, err)
	defer nettest.CloseNetNS(node)
	pod, err := nettest.NewNetNS()
	require.NoError(t, err)
	defer nettest.CloseNetNS(pod)
	require.NoError(t, node.Do(func(ns.NetNS) error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "rtnl0"}, PeerName: "rtnl1"})
	}))

	require.NoError(t, node.Do(func(ns.NetNS) error {
		require.Same(t, zero, H(), "outside a span")
		require.Zero(t, Sockets())

		end := Begin()
		defer end()
		h := H()
		require.NotSame(t, zero, h)
		require.Same(t, h, H(), "one socket per namespace")
		require.Equal(t, 1, Sockets())
		l, err := H().LinkByName("rtnl0")
		require.NoError(t, err)
		require.Equal(t, "rtnl0", l.Attrs().Name)

		var podH *netlinksafe.Handle
		require.NoError(t, pod.Do(func(ns.NetNS) error {
			podH = H()
			require.NotSame(t, h, podH, "a namespace of its own")
			require.Equal(t, []string{"lo"}, linkNames(t, podH))
			_, err := H().LinkByName("rtnl0")
			require.Error(t, err, "the pod's namespace has no rtnl0")
			return nil
		}))
		require.Equal(t, 2, Sockets())
		require.Same(t, h, H(), "back in the node's namespace")
		// A handle stays in the namespace it was made in, wherever the
		// thread that uses it is.
		require.Equal(t, []string{"lo"}, linkNames(t, podH))
		require.Contains(t, linkNames(t, h), "rtnl0")

		inner := Begin()
		inner()
		inner()
		require.Equal(t, 2, Sockets(), "a nested span's end keeps the sockets")
		require.Same(t, h, H())

		end()
		end()
		require.Zero(t, Sockets(), "the outermost end closes them")
		require.Same(t, zero, H())
		l, err = H().LinkByName("rtnl1")
		require.NoError(t, err, "requests work outside a span")
		require.Equal(t, "rtnl1", l.Attrs().Name)
		return nil
	}))
}

// A dump the kernel reports as interrupted is retried, then kept.
func TestDumpRetries(t *testing.T) {
	calls := 0
	v, err := dump(func() (int, error) {
		calls++
		if calls < 3 {
			return calls, netlink.ErrDumpInterrupted
		}
		return calls, nil
	})
	require.NoError(t, err)
	require.Equal(t, 3, v)

	calls = 0
	v, err = dump(func() (int, error) {
		calls++
		return calls, netlink.ErrDumpInterrupted
	})
	require.NoError(t, err, "the last answer is kept")
	require.Equal(t, maxAttempts, v)
	require.Equal(t, maxAttempts, calls)
}

// threadNetNS reads the same namespace as a stat of the thread's link,
// in the test's namespace and inside another.
func TestThreadNetNS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	other, err := nettest.NewNetNS()
	require.NoError(t, err)
	defer nettest.CloseNetNS(other)
	check := func() uint64 {
		var st unix.Stat_t
		require.NoError(t, unix.Stat("/proc/thread-self/ns/net", &st))
		ino, ok := threadNetNS()
		require.True(t, ok)
		require.Equal(t, st.Ino, ino)
		return ino
	}
	runtime.LockOSThread()
	here := check()
	runtime.UnlockOSThread()
	var there uint64
	require.NoError(t, other.Do(func(ns.NetNS) error { there = check(); return nil }))
	require.NotEqual(t, here, there)
}
