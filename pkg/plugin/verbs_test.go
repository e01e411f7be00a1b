package plugin

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/features"
)

// TestVerbsNameNoFeature: the verbs are the core steps and a loop over the
// registry; a feature is added in its own package and one line of
// pkg/features, never here. No file of this package, nor of the operator
// CLI (which finds the features' commands in the registry), imports a
// feature's package (nor pkg/uplink, which features share).
func TestVerbsNameNoFeature(t *testing.T) {
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
