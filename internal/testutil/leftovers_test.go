package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/pkg/cgroup"
)

// The end-of-run check finds each kind of leftover of its own run, and
// nothing of another run's, and removes what it found.
func TestLeftovers(t *testing.T) {
	RequireRoot(t)
	r := &run{pid: os.Getpid(), tmp: t.TempDir(), mounts: map[string]bool{}}
	ms, err := mountinfo()
	require.NoError(t, err)
	for _, m := range ms {
		r.mounts[m.id] = true
	}
	left, _ := r.leftovers()
	require.Empty(t, left, "a clean start")

	// Another run's namespace name (another pid) is not this run's.
	other := filepath.Join(nettest.NetNSDir, fmt.Sprintf("ebpfcni-%d-0", os.Getpid()+1_000_000))
	require.NoError(t, os.WriteFile(other, nil, 0o444))
	defer os.Remove(other)

	n, err := nettest.NewNetNS()
	require.NoError(t, err)
	mnt := filepath.Join(r.tmp, "bpffs")
	require.NoError(t, os.Mkdir(mnt, 0o700))
	require.NoError(t, unix.Mount("bpf", mnt, "bpf", 0, ""))
	root, err := cgroup.V2Root()
	require.NoError(t, err)
	cg, err := os.MkdirTemp(root, cgroupPrefix())
	require.NoError(t, err)
	sleep := exec.Command("sleep", "60")
	sleep.Env = append(os.Environ(), runMarker+"="+fmt.Sprint(os.Getpid()))
	require.NoError(t, sleep.Start())
	go func() { _ = sleep.Wait() }()

	left, clean := r.leftovers()
	all := strings.Join(left, "\n")
	require.Contains(t, all, "network namespace "+n.Path())
	require.Contains(t, all, "bpf mount at "+mnt)
	require.Contains(t, all, "cgroup "+cg)
	require.Contains(t, all, fmt.Sprintf("process %d (sleep 60)", sleep.Process.Pid))
	require.NotContains(t, all, other)
	require.Len(t, left, 4, all)
	n.Close()
	clean()

	left, _ = r.leftovers()
	require.Empty(t, left, "cleaned")
	_, err = os.Stat(cg)
	require.ErrorIs(t, err, os.ErrNotExist)
}
