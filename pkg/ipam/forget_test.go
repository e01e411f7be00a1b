package ipam

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A Forget cut short between unlinking the lock file and removing the
// directory leaves a directory without a lock: the next calls lock it
// anew (no call waits forever or fails), and the DEL of its last address
// removes it.
func TestDirectoryWithoutLockFile(t *testing.T) {
	s, c := openTestStore(t)
	_, err := AllocateIn(s, c, "a", "eth0", "/var/run/netns/a")
	require.NoError(t, err)
	s.Close()
	require.NoError(t, os.Remove(filepath.Join(c.StateDir, "ipam", c.Network, "lock")))

	s, err = OpenExisting(c)
	require.NoError(t, err)
	att, err := s.Attachment("a", "eth0")
	require.NoError(t, err)
	require.Equal(t, "/var/run/netns/a", att.NetNS, "the netns of the ADD is recorded")
	require.NoError(t, ReleaseAttachment(s, "a", "eth0"))
	forgot, err := s.Forget()
	require.NoError(t, err)
	require.True(t, forgot)
	require.True(t, s.Stateless())
	s.Close()
	_, err = os.Stat(filepath.Join(c.StateDir, "ipam", c.Network))
	require.ErrorIs(t, err, os.ErrNotExist)

	// Without bpffs too (ReleaseWithoutMaps).
	s, err = Open(c)
	require.NoError(t, err)
	_, err = Allocate(s, c, "b", "eth0")
	require.NoError(t, err)
	s.Close()
	require.NoError(t, os.Remove(filepath.Join(c.StateDir, "ipam", c.Network, "lock")))
	require.NoError(t, ReleaseWithoutMaps(c, "b", "eth0"))
	_, err = os.Stat(filepath.Join(c.StateDir, "ipam", c.Network, "owners", "b:eth0"))
	require.ErrorIs(t, err, os.ErrNotExist, "the record is released")
}
