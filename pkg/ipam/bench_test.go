package ipam

import (
	"fmt"
	"os"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

// BenchmarkAddDel measures one ADD and one DEL as the plugin performs them,
// Open (lock, maps, reconcile check) included, without the process start.
func BenchmarkAddDel(b *testing.B) {
	c, _, err := ParseConfig(conf(`"subnet":"10.9.0.0/16","bpfRoot":"`+testutil.BPFFS(b)+`","stateDir":"`+stateDir(b)+`"`), "")
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("c%d", i)
		s, err := Open(c)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Allocate(s, c, id, "eth0"); err != nil {
			b.Fatal(err)
		}
		s.Close()
		if s, err = Open(c); err != nil {
			b.Fatal(err)
		}
		if err := ReleaseAttachment(s, id, "eth0"); err != nil {
			b.Fatal(err)
		}
		s.Close()
	}
}

// stateDir is on tmpfs where the machine has one, as /run is on a real node.
func stateDir(b *testing.B) string {
	d, err := os.MkdirTemp("/dev/shm", "ebpf-ipam-bench-")
	if err != nil {
		return b.TempDir()
	}
	b.Cleanup(func() { os.RemoveAll(d) })
	return d
}
