package programs

import (
	"regexp"
	"strings"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// TestSafeTag: safeTag replaces what the regexp it replaced did, one '_'
// per character (a multi-byte one too), keeps the rest, and escapes the
// dots bpffs refuses in a name (maps.PinName).
func TestSafeTag(t *testing.T) {
	old := regexp.MustCompile(`[^A-Za-z0-9._-]`)
	for _, v := range []string{"ef6746c", "v1.2.3-rc.1", "ef6746c-dirty", "dev build/x+y", "naïve:tag", "", "A_Z.a-z.0-9", "tab\there"} {
		want := maps.PinName(old.ReplaceAllString(v, "_"))
		if got := safeTag(v); got != want {
			t.Errorf("safeTag(%q) = %q, want %q", v, got, want)
		}
		if strings.Contains(safeTag(v), ".") {
			t.Errorf("safeTag(%q) keeps a dot bpffs refuses", v)
		}
	}
}
