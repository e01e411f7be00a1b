package programs

import (
	"regexp"
	"testing"
)

// TestSafeTag: safeTag replaces what the regexp it replaced did, one '_'
// per character (a multi-byte one too), and keeps the rest.
func TestSafeTag(t *testing.T) {
	old := regexp.MustCompile(`[^A-Za-z0-9._-]`)
	for _, v := range []string{"ef6746c", "v1.2.3-rc.1", "ef6746c-dirty", "dev build/x+y", "naïve:tag", "", "A_Z.a-z.0-9", "tab\there"} {
		want := old.ReplaceAllString(v, "_")
		if got := safeTag(v); got != want {
			t.Errorf("safeTag(%q) = %q, want %q", v, got, want)
		}
	}
}
