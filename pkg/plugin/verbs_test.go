package plugin

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/features"
)

// needSource skips a test that reads the module's source files where the
// test binary runs without them (make test-kernel's guest); in a checkout
// they are there, and the test runs.
func needSource(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("../../go.mod"); err != nil {
		t.Skipf("reads the module's source files, not here: %v", err)
	}
}

// TestVerbsNameNoFeature: the verbs are the core steps (the endpoint,
// pkg/endpoint, is one of them: they call it by name) and a loop over the
// registry; a feature is added in its own package and one line of
// pkg/features, never here. No file of this package, nor of the operator
// CLI (which finds the features' commands in the registry), imports a
// feature's package (nor pkg/uplink, which features share).
func TestVerbsNameNoFeature(t *testing.T) {
	needSource(t)
	forbidden := map[string]bool{"github.com/ebpf-cni/ebpf-cni/pkg/uplink": true}
	for _, f := range features.All {
		forbidden[reflect.TypeOf(f).PkgPath()] = true
	}
	require.Len(t, forbidden, len(features.All)+1)
	var files []string
	for _, dir := range []string{".", "../cli"} {
		fs, err := filepath.Glob(filepath.Join(dir, "*.go"))
		require.NoError(t, err)
		require.NotEmpty(t, fs, dir)
		files = append(files, fs...)
	}
	for _, file := range files {
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ImportsOnly)
		require.NoError(t, err)
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			require.False(t, forbidden[path], "%s imports %s: reach features through pkg/features", file, path)
		}
	}
}

// TestFeaturesImportNoFeature: no feature's package imports another
// feature's, directly or through any package of the module: what two
// features share (the conntrack/NAT table, the cluster's ranges, the
// uplinks) is a building block below both.
func TestFeaturesImportNoFeature(t *testing.T) {
	needSource(t)
	const module = "github.com/ebpf-cni/ebpf-cni/"
	feats := map[string]bool{}
	for _, f := range features.All {
		feats[reflect.TypeOf(f).PkgPath()] = true
	}
	require.Len(t, feats, len(features.All))
	imports := map[string][]string{} // package -> the module's packages it imports (not its tests)
	var load func(pkg string)
	load = func(pkg string) {
		if _, done := imports[pkg]; done {
			return
		}
		imports[pkg] = nil
		files, err := filepath.Glob(filepath.Join("../..", strings.TrimPrefix(pkg, module), "*.go"))
		require.NoError(t, err)
		require.NotEmpty(t, files, pkg)
		for _, file := range files {
			if strings.HasSuffix(file, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ImportsOnly)
			require.NoError(t, err)
			for _, imp := range f.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				if strings.HasPrefix(path, module) {
					imports[pkg] = append(imports[pkg], path)
					load(path)
				}
			}
		}
	}
	for pkg := range feats {
		load(pkg)
	}
	for pkg := range feats {
		// Every package pkg reaches, with the chain that reaches it.
		via := map[string]string{pkg: pkg}
		queue := []string{pkg}
		for len(queue) > 0 {
			p := queue[0]
			queue = queue[1:]
			for _, dep := range imports[p] {
				if _, seen := via[dep]; !seen {
					via[dep] = via[p] + " -> " + dep
					queue = append(queue, dep)
				}
			}
		}
		var bad []string
		for other := range feats {
			if other != pkg && via[other] != "" {
				bad = append(bad, via[other])
			}
		}
		sort.Strings(bad)
		require.Empty(t, bad, "a feature imports another: make what they share a building block")
	}
}
