// Package layers_test checks that the module's packages import one way:
// down the layers of the table below, never up and never in a cycle.
package layers_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/ebpf-cni/ebpf-cni/"

// layers are every package of the module, top to bottom. A package may
// import packages of lower layers only: not of a higher one, nor of its own
// unless the layer says within. A new package takes its place here. A path
// ending in "/..." stands for every package below it.
var layers = []struct {
	name   string
	pkgs   []string
	within bool // its packages may import each other
}{
	// Tests, benchmarks, the demo, their fixtures and the generators:
	// they may import anything, production code none of them.
	{"tests", []string{"test/...", "internal/..."}, true},
	{"mains", []string{"cmd/ebpf-cni", "cmd/ebpf-ipam", "cmd/ebpf-cni-agent"}, false},
	{"cli", []string{"pkg/cli"}, false},
	{"verbs", []string{"pkg/plugin", "pkg/agent"}, false},
	// The compiler of NetworkPolicies into the policy feature's rule
	// entries: the agent's alone (pure Go, k8s.io/api, kept out of the
	// plugin binaries). It builds the entries of the feature's maps, so it
	// sits above the feature (pkg/policy: maps, feature and command in one
	// package, as every feature keeps its own), not beside it in the
	// building blocks; nothing below the verbs imports it.
	{"the agent's NetworkPolicy compiler", []string{"pkg/policy/compile"}, false},
	// Reconciliation of the kernel and the caches, below the verbs.
	{"repair", []string{"pkg/repair"}, false},
	{"registry", []string{"pkg/features"}, false},
	// The features: every package pkg/features registers that is in no
	// other layer (a new feature's registration line puts it here).
	{"features", nil, false},
	// Building blocks, each layer on the ones below it.
	{"blocks: the core's endpoint step and what features share", []string{"pkg/endpoint", "pkg/uplink",
		"pkg/conntrack", "pkg/clusterranges"}, false},
	{"blocks: a DEL's flush of the NAT and flow tables", []string{"pkg/podflush"}, false},
	{"blocks: the feature contract", []string{"pkg/feature"}, false},
	// What an operator CLI command is made of; a command reads the node
	// through the node handle.
	{"blocks: the CLI's toolkit", []string{"pkg/view"}, false},
	{"blocks: the node handle", []string{"pkg/node"}, false},
	{"blocks: programs", []string{"pkg/programs"}, false},
	{"blocks: attachments, IPAM", []string{"pkg/attach", "pkg/ipam"}, false},
	{"blocks: leaves", []string{"pkg/counters", "pkg/events", "pkg/veth", "pkg/errcode",
		"pkg/kernel", "pkg/conflist", "pkg/buildinfo", "pkg/cgroup", "pkg/calls"}, false},
	// The one configuration error and the rules of keys two configurations
	// share (the plugin's, the installer's conflist).
	{"configuration", []string{"pkg/config"}, false},
	{"netlink: one socket per namespace for a call", []string{"pkg/rtnl"}, false},
	{"maps", []string{"pkg/maps"}, false},
}

// registry is the package whose imports are the features.
const registry = "pkg/features"

// layerOf is the index of p's layer in layers (0 is the top), or -1;
// registered are the packages the registry imports.
func layerOf(p string, registered map[string]bool) int {
	features := -1
	for i, l := range layers {
		if l.name == "features" {
			features = i
		}
		for _, q := range l.pkgs {
			if q == p || strings.HasSuffix(q, "/...") && strings.HasPrefix(p, strings.TrimSuffix(q, "...")) {
				return i
			}
		}
	}
	if registered[p] {
		return features
	}
	return -1
}

// registeredFeatures are the module's packages the registry imports.
func registeredFeatures(pkgs []pkg) map[string]bool {
	out := map[string]bool{}
	for _, p := range pkgs {
		if p.ImportPath != module+registry {
			continue
		}
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, module) {
				out[strings.TrimPrefix(imp, module)] = true
			}
		}
	}
	return out
}

type pkg struct {
	ImportPath string
	Imports    []string
	Error      *struct{ Err string }
	DepsErrors []*struct{ Err string }
}

// list is every package of the module with its (non-test) imports.
func list(t *testing.T) []pkg {
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Imports,Error,DepsErrors", "./...")
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go list: %s", stderr.String())
	var pkgs []pkg
	d := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		err := d.Decode(&p)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		pkgs = append(pkgs, p)
	}
	require.NotEmpty(t, pkgs)
	return pkgs
}

// TestLayers: no import cycle, every package in the table, and every
// import of the module's own packages goes to a lower layer.
func TestLayers(t *testing.T) {
	var bad []string
	pkgs := list(t)
	registered := registeredFeatures(pkgs)
	require.True(t, registered["pkg/nat"], "pkg/features registers pkg/nat: the registry's imports are read")
	for _, p := range pkgs {
		if p.Error != nil {
			bad = append(bad, p.ImportPath+": "+p.Error.Err)
		}
		for _, e := range p.DepsErrors {
			bad = append(bad, p.ImportPath+": "+e.Err)
		}
		from := strings.TrimPrefix(p.ImportPath, module)
		lf := layerOf(from, registered)
		if lf < 0 {
			bad = append(bad, from+": in no layer (add it to the table of test/layers)")
			continue
		}
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			to := strings.TrimPrefix(imp, module)
			lt := layerOf(to, registered)
			if lt > lf || lt == lf && layers[lf].within {
				continue
			}
			switch {
			case lt < 0:
				bad = append(bad, fmt.Sprintf("%s (%s) imports %s: in no layer", from, layers[lf].name, to))
			case lt == lf:
				bad = append(bad, fmt.Sprintf("%s imports %s: both in %s", from, to, layers[lf].name))
			default:
				bad = append(bad, fmt.Sprintf("%s (%s) imports %s: up, in %s", from, layers[lf].name, to, layers[lt].name))
			}
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		t.Fatalf("imports against the layers (test/layers):\n%s", strings.Join(bad, "\n"))
	}
}
