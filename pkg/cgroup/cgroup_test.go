package cgroup

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseMountinfo(t *testing.T) {
	// A hybrid host (v1 controllers under a tmpfs at /sys/fs/cgroup, v2 at
	// unified), a bind mount of a v2 subdirectory, a mount point with a
	// space, and a mount from another cgroup namespace.
	const mi = `25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
26 25 0:24 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
27 26 0:25 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
28 26 0:26 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:12 - cgroup cgroup rw,memory
40 30 0:25 /system.slice /srv/cg rw,relatime - cgroup2 cgroup2 rw
41 30 0:25 / /run/my\040cg rw,relatime shared:50 master:10 - cgroup2 none rw
42 30 0:25 /../.. /run/other rw,relatime - cgroup2 none rw
`
	ms, err := parseMountinfo(strings.NewReader(mi))
	require.NoError(t, err)
	require.Equal(t, []Mount{
		{Point: "/sys/fs/cgroup/unified", Root: "/"},
		{Point: "/srv/cg", Root: "/system.slice"},
		{Point: "/run/my cg", Root: "/"},
		{Point: "/run/other", Root: "/../.."},
	}, ms)
}

func TestUnescape(t *testing.T) {
	require.Equal(t, "a b\tc\\d", unescape(`a\040b\011c\134d`))
	require.Equal(t, `tail\04`, unescape(`tail\04`), "a short escape is kept")
	require.Equal(t, "plain", unescape("plain"))
}
