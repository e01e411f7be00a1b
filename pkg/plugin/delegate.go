package plugin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/types/create"
	"github.com/containernetworking/cni/pkg/version"
)

// The delegation of the CNI spec ("Delegated plugins"), as libcni's
// invoke.Delegate* do it: the plugin is found in CNI_PATH and runs with
// this call's environment, CNI_COMMAND set to the verb, the attachment's
// CNI_* variables from its arguments, and the IPAM configuration on stdin. Written here because invoke carries OpenTelemetry,
// net/http and TLS into the binary: 1.5 MB, and 0.5-1 ms of every exec of
// ebpf-cni, which has no use for them.

// delegate runs plugin for verb and returns what it printed. A failure is
// a *types.Error: the one the plugin printed, or code 0 naming what went
// wrong (ipamError turns code 0 into errcode.IPAM).
func delegate(verb string, a *skel.CmdArgs, plugin string, conf []byte) ([]byte, error) {
	path, err := findInPath(plugin, filepath.SplitList(a.Path))
	if err != nil {
		return nil, err
	}
	env := delegateEnv(verb, a)
	for try := 0; ; try++ {
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(path)
		cmd.Env, cmd.Stdin, cmd.Stdout, cmd.Stderr = env, bytes.NewReader(conf), &stdout, &stderr
		err := cmd.Run()
		if err == nil {
			return stdout.Bytes(), nil
		}
		// "text file busy": the plugin's binary is being written (an
		// install in progress); it gets five more seconds.
		if !strings.Contains(err.Error(), "text file busy") || try == 5 {
			return nil, pluginError(err, stdout.Bytes(), stderr.Bytes())
		}
		time.Sleep(time.Second)
	}
}

// delegateEnv is this process's environment with the CNI_* variables of
// verb and a instead of its own (those a leaves empty unset, as the spec
// has them for STATUS and GC).
func delegateEnv(verb string, a *skel.CmdArgs) []string {
	vars := [][2]string{{"CNI_COMMAND", verb}, {"CNI_CONTAINERID", a.ContainerID}, {"CNI_NETNS", a.Netns},
		{"CNI_IFNAME", a.IfName}, {"CNI_ARGS", a.Args}, {"CNI_PATH", a.Path}}
	var env []string
	for _, kv := range os.Environ() {
		own := false
		for _, v := range vars {
			own = own || strings.HasPrefix(kv, v[0]+"=")
		}
		if !own {
			env = append(env, kv)
		}
	}
	for _, v := range vars {
		if v[1] != "" {
			env = append(env, v[0]+"="+v[1])
		}
	}
	return env
}

// findInPath is the first regular file named plugin in paths.
func findInPath(plugin string, paths []string) (string, error) {
	if plugin == "" || strings.ContainsRune(plugin, os.PathSeparator) {
		return "", fmt.Errorf("invalid plugin name %q", plugin)
	}
	for _, dir := range paths {
		p := filepath.Join(dir, plugin)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("failed to find plugin %q in path %s", plugin, paths)
}

// pluginError is the error a failed plugin printed on stdout, or one that
// says how it failed.
func pluginError(err error, stdout, stderr []byte) error {
	e := &types.Error{}
	switch {
	case len(stdout) > 0:
		if perr := json.Unmarshal(stdout, e); perr != nil {
			e.Msg = fmt.Sprintf("netplugin failed but error parsing its diagnostic message %q: %v", stdout, perr)
		}
	case len(stderr) > 0:
		e.Msg = fmt.Sprintf("netplugin failed: %q: %v", stderr, err)
	default:
		e.Msg = fmt.Sprintf("netplugin failed with no error message: %v", err)
	}
	return e
}

// delegatedResult parses what the plugin printed for ADD: a result without
// a cniVersion is taken to be of the configuration's version.
func delegatedResult(conf, out []byte) (types.Result, error) {
	confVersion, err := (&version.ConfigDecoder{}).Decode(conf)
	if err != nil {
		return nil, err
	}
	var raw map[string]any
	if err := json.Unmarshal(out, &raw); err != nil {
		return nil, fmt.Errorf("failed to unmarshal raw result: %w", err)
	}
	if v, ok := raw["cniVersion"].(string); ok && v != "" {
		return create.Create(v, out)
	}
	if raw == nil { // "null"
		raw = map[string]any{}
	}
	raw["cniVersion"] = confVersion
	if out, err = json.Marshal(raw); err != nil {
		return nil, fmt.Errorf("failed to remarshal fixed result: %w", err)
	}
	return create.Create(confVersion, out)
}
