package cli

import (
	"io"
	"sort"
	"strings"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

var errNoMap = view.ErrNoMap

func bpffsMount(path string) (string, bool, error) { return view.BPFFSMount(path) }

func writeJSON(w io.Writer, v any) error { return view.WriteJSON(w, v) }

func orDash(s string) string { return view.OrDash(s) }

// tagVersion is the binary version a program tag was built from
// ("<version>-<digest>").
func tagVersion(tag string) string {
	if i := strings.LastIndexByte(tag, '-'); i > 0 {
		tag = tag[:i]
	}
	return maps.FromPinName(tag)
}

// sortedKeys lists a map's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
