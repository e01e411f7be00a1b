package features

import (
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
)

// The generated digest is the objects' own: a stale one would name this
// build's programs with another build's tag, and a node would keep old
// programs after an upgrade.
func TestDigestCurrent(t *testing.T) {
	if got := programs.Digest(Objects()); got != objectsDigest {
		t.Fatalf("digest_gen.go says %q, the objects hash to %q: run make generate and commit", objectsDigest, got)
	}
	if Tag() != programs.Tag(Objects()) {
		t.Fatalf("Tag() = %q, programs.Tag(Objects()) = %q", Tag(), programs.Tag(Objects()))
	}
}
