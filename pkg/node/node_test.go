package node

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
)

// A record written by a build before feature state (hostPorts at the top
// level) keeps that field in Legacy, for the feature that wrote it; a
// record written again keeps it too.
func TestRecordLegacyFields(t *testing.T) {
	dir := t.TempDir()
	old := `{"containerID":"c1","ifname":"eth0","network":"n","hostIfname":"ec0123456789ab","hostIfindex":7,
		"hostMAC":"0e:00:00:00:00:01","mac":"0e:00:00:00:00:02","ips":["10.0.0.2/24"],
		"attachments":[{"hook":"from_container","mode":"tcx","pin":"/x/from_container"}],
		"hostPorts":[{"protocol":"tcp","hostPort":8080,"podIP":"10.0.0.2","containerPort":80}]}`
	require.NoError(t, os.MkdirAll(recordDir(dir), 0o700))
	require.NoError(t, os.WriteFile(recordPath(dir, "ec0123456789ab"), []byte(old), 0o600))
	r, err := ReadRecord(dir, "ec0123456789ab")
	require.NoError(t, err)
	require.Equal(t, "c1", r.ContainerID)
	require.Equal(t, []attach.Attachment{{Hook: "from_container", Mode: attach.ModeTCX, Pin: "/x/from_container"}}, r.Attachments)
	require.Len(t, r.Legacy, 1)
	require.JSONEq(t, `[{"protocol":"tcp","hostPort":8080,"podIP":"10.0.0.2","containerPort":80}]`, string(r.Legacy["hostPorts"]))

	require.NoError(t, r.SetFeature("x", map[string]int{"a": 1}))
	require.NoError(t, WriteRecord(dir, r))
	again, err := ReadRecord(dir, "ec0123456789ab")
	require.NoError(t, err)
	require.JSONEq(t, string(r.Legacy["hostPorts"]), string(again.Legacy["hostPorts"]), "written again, the legacy field stays")
	var x map[string]int
	ok, err := again.Feature("x", &x)
	require.True(t, ok)
	require.NoError(t, err)
	require.Equal(t, 1, x["a"])
	ok, err = again.Feature("y", &x)
	require.False(t, ok)
	require.NoError(t, err)
	require.NoError(t, again.SetFeature("x", nil))
	_, ok = again.Features["x"]
	require.False(t, ok)

	require.Equal(t, "10.0.0.0/24", again.Nets()[0].String())
	require.Equal(t, "10.0.0.2", again.Addrs()[0].String())
}

// Attachment sets are listed by owner or all together; the uplink records
// of builds before attachment sets (stateDir/uplinks) are moved into them
// when a node is opened.
func TestAttachmentSets(t *testing.T) {
	dir := t.TempDir()
	legacy := filepath.Join(dir, "uplinks")
	require.NoError(t, os.MkdirAll(legacy, 0o700))
	b, err := json.Marshal(map[string]any{"name": "eth0", "ifindex": 2, "attachments": []attach.Attachment{{Hook: "from_netdev", Mode: attach.ModeTC, Priority: 1, Handle: 1}}})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(legacy, "eth0.json"), b, 0o600))

	n, err := Open(Options{StateDir: dir})
	require.NoError(t, err)
	defer n.Close()
	_, err = os.Stat(legacy)
	require.ErrorIs(t, err, os.ErrNotExist, "the legacy directory is gone")
	require.NoError(t, n.SaveAttachments(&AttachmentSet{Owner: "cgroup", Name: "hostport", Attachments: []attach.Attachment{{Hook: "h", Mode: attach.ModeCgroup, Pin: "/p/h"}}}))

	ups, err := n.AttachmentSets("uplinks")
	require.NoError(t, err)
	require.Len(t, ups, 1)
	require.Equal(t, AttachmentSet{Owner: "uplinks", Name: "eth0", IfIndex: 2, Attachments: []attach.Attachment{{Hook: "from_netdev", Mode: attach.ModeTC, Priority: 1, Handle: 1}}}, *ups[0])
	all, err := n.AttachmentSets("")
	require.NoError(t, err)
	require.Len(t, all, 2)

	require.NoError(t, n.RemoveAttachments("uplinks", "eth0"))
	require.NoError(t, n.RemoveAttachments("uplinks", "eth0"), "removing twice is fine")
	all, err = n.AttachmentSets("")
	require.NoError(t, err)
	require.Len(t, all, 1)
	require.Error(t, n.SaveAttachments(&AttachmentSet{Owner: "a/b", Name: "x"}))
}

// ReleaseIfEmpty runs only when no endpoint record is left.
func TestReleaseIfEmpty(t *testing.T) {
	dir := t.TempDir()
	n, err := Open(Options{StateDir: dir})
	require.NoError(t, err)
	defer n.Close()
	require.NoError(t, n.WriteRecord(&Record{HostIfName: "ec1"}))
	ran := false
	require.False(t, n.ReleaseIfEmpty(func() { ran = true }))
	require.False(t, ran)
	require.NoError(t, n.RemoveRecord("ec1"))
	require.True(t, n.ReleaseIfEmpty(func() { ran = true }))
	require.True(t, ran)
}

func TestPhases(t *testing.T) {
	n := &Node{}
	n.Phase("a")
	time.Sleep(time.Millisecond)
	n.Phase("b")
	got := n.Phases()
	require.Len(t, got, 2)
	require.Equal(t, "a", got[0].Name)
	require.GreaterOrEqual(t, got[0].Took, time.Millisecond)
	require.Equal(t, "b", got[1].Name)
}
