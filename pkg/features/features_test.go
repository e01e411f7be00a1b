package features

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
)

// The registry is consistent: features have distinct names, their program
// objects hold the programs their hooks name, hooks are distinct and say
// where they run, and commands are distinct.
func TestRegistry(t *testing.T) {
	names := map[string]bool{}
	for _, f := range All {
		require.False(t, names[f.Name()], "feature %s registered twice", f.Name())
		names[f.Name()] = true
	}
	hooks := map[string]bool{}
	objs := map[string]bool{}
	for _, o := range Objects() {
		require.False(t, objs[o.Name], "object %s listed twice", o.Name)
		objs[o.Name] = true
		spec, err := o.Load()
		require.NoError(t, err, o.Name)
		for _, h := range o.Hooks {
			require.False(t, hooks[h.Name], "hook %s twice", h.Name)
			hooks[h.Name] = true
			require.Contains(t, spec.Programs, h.Name, "object %s has no program for hook %s", o.Name, h.Name)
			require.Contains(t, []attach.Target{attach.Endpoint, attach.NetkitEndpoint, attach.Device, attach.Cgroup}, h.Target, h.Name)
			if h.Target == attach.NetkitEndpoint {
				require.Contains(t, hookNames(), h.Instead, "netkit hook %s runs instead of an endpoint hook", h.Name)
			}
		}
	}
	commands := map[string]bool{}
	for _, c := range Commands() {
		require.False(t, commands[c.Name], "command %s twice", c.Name)
		commands[c.Name] = true
		require.NotEmpty(t, c.Summary, c.Name)
	}
}

// hookNames are the names of every registered hook.
func hookNames() []string {
	var out []string
	for _, o := range Objects() {
		for _, h := range o.Hooks {
			out = append(out, h.Name)
		}
	}
	return out
}
