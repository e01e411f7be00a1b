package hugeheap

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// vmaOf returns the /proc/self/smaps entry of the mapping holding addr.
func vmaOf(t *testing.T, addr uintptr) (lo, hi uintptr, fields map[string]string) {
	f, err := os.Open("/proc/self/smaps")
	require.NoError(t, err)
	defer f.Close()
	s := bufio.NewScanner(f)
	found := false
	for s.Scan() {
		line := s.Text()
		var a, b uintptr
		if n, _ := fmt.Sscanf(line, "%x-%x ", &a, &b); n == 2 && strings.Contains(strings.Fields(line)[0], "-") {
			if found {
				return lo, hi, fields
			}
			if a <= addr && addr < b {
				found, lo, hi, fields = true, a, b, map[string]string{}
			}
			continue
		}
		if found {
			if k, v, ok := strings.Cut(line, ":"); ok {
				fields[k] = strings.TrimSpace(v)
			}
		}
	}
	require.NoError(t, s.Err())
	require.True(t, found, "no mapping holds %#x", addr)
	return lo, hi, fields
}

func TestHeapChunkIsMarkedHuge(t *testing.T) {
	if _, err := os.Stat("/sys/kernel/mm/transparent_hugepage/enabled"); err != nil {
		t.Skip("kernel without transparent huge pages")
	}
	require.True(t, Applied, "madvise(MADV_HUGEPAGE) failed on the heap's first chunk")
	addr := uintptr(unsafe.Pointer(probe))
	chunk := addr &^ (chunkBytes - 1)
	lo, hi, f := vmaOf(t, addr)
	// The mapping carries the flag over the whole first chunk.
	require.LessOrEqual(t, lo, chunk)
	require.GreaterOrEqual(t, hi, chunk+chunkBytes)
	require.Contains(t, strings.Fields(f["VmFlags"]), "hg", "VmFlags of the heap chunk: %s", f["VmFlags"])
}

func TestHeapPagesAreHuge(t *testing.T) {
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil || strings.Contains(string(b), "[never]") {
		t.Skip("transparent huge pages are off")
	}
	_, _, f := vmaOf(t, uintptr(unsafe.Pointer(probe)))
	// What the runtime touched before init was collapsed, and the rest of
	// the chunk faults in whole huge pages.
	require.NotEqual(t, "0 kB", f["AnonHugePages"], "no huge page behind the heap: %v", f)
}
