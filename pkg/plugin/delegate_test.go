package plugin

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/errcode"
)

// fakeIPAM writes an IPAM "plugin" (a shell script) into a CNI_PATH of its
// own and returns the arguments of an ADD and the configuration that
// names it.
func fakeIPAM(t *testing.T, script string) (*skel.CmdArgs, *Config) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "fake-ipam"), []byte("#!/bin/sh\n"+script), 0o755))
	a := &skel.CmdArgs{ContainerID: "c1", Netns: "/run/netns/p1", IfName: "eth7", Args: "IgnoreUnknown=1",
		Path: filepath.Join(t.TempDir(), "empty") + string(filepath.ListSeparator) + dir}
	return a, &Config{IPAMType: "fake-ipam", IPAMConf: []byte(`{"cniVersion":"1.0.0","name":"n","ipam":{"type":"fake-ipam"}}`)}
}

// The delegated plugin gets the verb in CNI_COMMAND, the attachment's
// CNI_* variables from the arguments (not this process's), the rest of the
// environment, and the configuration on stdin; a result without a
// cniVersion is read as the configuration's.
func TestDelegateAdd(t *testing.T) {
	a, c := fakeIPAM(t, `
[ "$CNI_COMMAND" = ADD ] || { echo '{"code":4,"msg":"command '$CNI_COMMAND'"}'; exit 1; }
[ "$CNI_CONTAINERID/$CNI_NETNS/$CNI_IFNAME/$CNI_ARGS" = c1//run/netns/p1/eth7/IgnoreUnknown=1 ] || { echo '{"code":4,"msg":"attachment '$CNI_CONTAINERID/$CNI_NETNS/$CNI_IFNAME/$CNI_ARGS'"}'; exit 1; }
[ "$OTHER" = kept ] || { echo '{"code":4,"msg":"environment"}'; exit 1; }
grep -q '"type":"fake-ipam"' || { echo '{"code":4,"msg":"stdin"}'; exit 1; }
echo '{"ips":[{"address":"10.1.2.3/24"}]}'
`)
	for k, v := range map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c0", "CNI_NETNS": "/run/netns/p0",
		"CNI_IFNAME": "eth0", "CNI_ARGS": "K8S_POD_NAME=p0", "CNI_PATH": "/nowhere", "OTHER": "kept"} {
		t.Setenv(k, v)
	}
	r, err := execIPAM{}.Add(a, c)
	require.NoError(t, err)
	require.Equal(t, "1.0.0", r.Version())
	res, err := current.NewResultFromResult(r)
	require.NoError(t, err)
	require.Len(t, res.IPs, 1)
	require.Equal(t, "10.1.2.3/24", res.IPs[0].Address.String())

	// The verb is DEL although this call's CNI_COMMAND is ADD: the script
	// refuses it.
	err = execIPAM{}.Del(a, c)
	require.ErrorContains(t, err, "command DEL")
}

// STATUS and GC name no attachment: the child has no CNI_CONTAINERID,
// CNI_NETNS, CNI_IFNAME, whatever this process has.
func TestDelegateStatusNamesNoAttachment(t *testing.T) {
	a, c := fakeIPAM(t, `
[ "$CNI_COMMAND" = STATUS ] || { echo '{"code":4,"msg":"command '$CNI_COMMAND'"}'; exit 1; }
[ -z "${CNI_CONTAINERID+x}${CNI_NETNS+x}${CNI_IFNAME+x}" ] || { echo '{"code":4,"msg":"attachment set"}'; exit 1; }
`)
	t.Setenv("CNI_CONTAINERID", "c0")
	t.Setenv("CNI_IFNAME", "eth0")
	require.NoError(t, execIPAM{}.Status(&skel.CmdArgs{Path: a.Path}, c))
}

// A failing plugin's own error comes through with its code; one that
// prints nothing usable is code 0, which ipamError makes errcode.IPAM.
func TestDelegateErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		script string
		code   uint
		msg    string
	}{
		"its error":   {`echo '{"cniVersion":"1.0.0","code":11,"msg":"no addresses left"}'; exit 1`, 11, "no addresses left"},
		"garbage":     {`echo 'panic: oops'; exit 2`, errcode.IPAM, "error parsing its diagnostic message"},
		"stderr only": {`echo 'segfault' >&2; exit 2`, errcode.IPAM, "segfault"},
		"silent":      {`exit 3`, errcode.IPAM, "no error message"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := execIPAM{}.Add(fakeIPAM(t, tc.script))
			err = ipamError("ADD", err)
			var te *types.Error
			require.ErrorAs(t, err, &te)
			require.Equal(t, tc.code, te.Code, te.Error())
			require.Contains(t, te.Error(), tc.msg)
		})
	}
	t.Run("not in CNI_PATH", func(t *testing.T) {
		a, c := fakeIPAM(t, "exit 0")
		c.IPAMType = "no-such-ipam"
		err := execIPAM{}.Del(a, c)
		require.ErrorContains(t, err, `failed to find plugin "no-such-ipam"`)
	})
	t.Run("result is not JSON", func(t *testing.T) {
		_, err := execIPAM{}.Add(fakeIPAM(t, "echo hello"))
		require.ErrorContains(t, err, "unmarshal")
	})
}
