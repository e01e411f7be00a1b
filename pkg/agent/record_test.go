package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestInstallRecord: the record reads back what was saved, an entry added
// twice is there once (a reinstall keeps the record), and a line uninstall
// could not trust fails the read, naming the line: an unknown kind, a name
// with a directory in it, a content that is no SHA-256.
func TestInstallRecord(t *testing.T) {
	dir := t.TempDir()
	rec, err := readRecord(dir)
	require.NoError(t, err)
	require.Empty(t, rec, "no record: nothing was installed")

	sum := sha256Of([]byte("loopback"))
	for range 2 {
		rec.add(recordEntry{Dir: recordBin, Name: "ebpf-cni"})
		rec.add(recordEntry{Dir: recordBin, Name: Loopback, SHA256: sum})
		rec.add(recordEntry{Dir: recordConf, Name: "10-ebpf-cni.conflist"})
	}
	rec.add(recordEntry{Dir: recordBin, Name: Loopback, SHA256: sha256Of([]byte("an older one"))})
	require.NoError(t, rec.save(dir))
	back, err := readRecord(dir)
	require.NoError(t, err)
	require.Equal(t, rec, back)
	require.Len(t, back, 4)
	require.Equal(t, []string{sum, sha256Of([]byte("an older one"))}, back.sums(Loopback))
	require.Empty(t, back.sums("ebpf-cni"))

	for _, bad := range []string{
		"file /opt/cni/bin/ebpf-cni", // make install's format
		"bin ../../etc/passwd",
		"conf ..",
		"bin " + InstallRecord,
		"bin loopback sha256=xyz",
		"bin loopback " + sum,
		"conf 10-ebpf-cni.conflist sha256=" + sum,
		"bin a b c d",
	} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, InstallRecord), []byte(recordHeader+"\nbin ebpf-cni\n"+bad+"\n"), 0o644))
		_, err := readRecord(dir)
		require.ErrorContains(t, err, "line 3: unexpected", bad)
		require.True(t, strings.Contains(err.Error(), bad), err)
	}
}
