package hugeheap

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime/debug"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// sink keeps the test's allocations on the heap.
var sink [][]byte

// childEnv marks the test binary that TestCallProcess runs as a CNI call.
const childEnv = "HUGEHEAP_TEST_CHILD"

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

// A process that is not a CNI call (the CLI, this test binary) is left
// alone: the collector on, the heap where the runtime put it.
func TestNotACall(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("the child is a call")
	}
	require.False(t, call)
	require.Zero(t, region)
	require.Empty(t, pads)
	require.Empty(t, holes)
	if os.Getenv("GOGC") == "" {
		prev := debug.SetGCPercent(100)
		require.Equal(t, 100, prev, "the collector was turned off")
	}
}

// The test binary again, with CNI_COMMAND set: init takes it for a call.
func TestCallProcess(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("in the child")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestInCall$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "CNI_COMMAND=VERSION", childEnv+"=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Regexp(t, `--- (PASS|SKIP): TestInCall`, string(out), "the child ran no test")
	t.Logf("the child:\n%s", out)
}

func TestInCall(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("runs in TestCallProcess's child")
	}
	require.True(t, call)
	require.Equal(t, -1, debug.SetGCPercent(-1), "the collector is on in a call")
	if !madviseMode() {
		require.Zero(t, region)
		t.Skip("transparent huge pages are not in madvise mode: the heap stays")
	}
	require.NotZero(t, region, "init did not move the heap to a huge-page boundary")
	require.Zero(t, region%hugeBytes)
	lo, hi, f := vmaOf(t, region)
	require.LessOrEqual(t, lo, region)
	require.GreaterOrEqual(t, hi, region+hugeBytes)
	require.Contains(t, strings.Fields(f["VmFlags"]), "hg", "VmFlags at the boundary: %s", f["VmFlags"])
	// init's stack growth touched it: one huge page, not 4 KiB ones.
	require.NotEqual(t, "0 kB", f["AnonHugePages"], "no huge page behind the heap: %v", f)
	// And the heap goes on there: init's last one-page object came from
	// there (the cache of init's P, from which the call's small objects
	// come as long as it runs there), and a large object comes first fit.
	last := uintptr(unsafe.Pointer(holes[len(holes)-1]))
	require.True(t, region <= last && last < region+hugeBytes, "init's last page at %#x, the region at %#x", last, region)
	large := make([]byte, largeBytes)
	sink = append(sink, large) // on the heap, not the stack
	at := uintptr(unsafe.Pointer(unsafe.SliceData(large)))
	require.True(t, region <= at && at < region+hugeBytes, "an allocation after init at %#x, the region at %#x", at, region)
}
