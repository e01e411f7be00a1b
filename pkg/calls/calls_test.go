package calls

import (
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func rec(verb string, code uint) Record {
	return Record{Time: 1, Verb: verb, Code: code, Total: 1.5, Phases: map[string]float64{"parse": 0.1}}
}

// TestTailReadsWhatIsAppended: a tail started on an existing file skips
// what was there (an agent restart counts nothing twice), then reads each
// record once, a half-written line only once it is complete.
func TestTailReadsWhatIsAppended(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, Append(dir, rec("ADD", 0)))
	tail := NewTail(dir)
	got, err := tail.Read()
	require.NoError(t, err)
	require.Empty(t, got, "a record from before the tail started")

	require.NoError(t, Append(dir, rec("DEL", 0)))
	require.NoError(t, Append(dir, rec("ADD", 7)))
	got, err = tail.Read()
	require.NoError(t, err)
	require.Equal(t, []Record{rec("DEL", 0), rec("ADD", 7)}, got)
	got, err = tail.Read()
	require.NoError(t, err)
	require.Empty(t, got)

	f, err := os.OpenFile(Path(dir), os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.WriteString(`{"t":1,"verb":"CHECK"`)
	require.NoError(t, err)
	got, err = tail.Read()
	require.NoError(t, err)
	require.Empty(t, got, "half a line")
	_, err = f.WriteString(`,"code":0,"ms":2}` + "\n")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	got, err = tail.Read()
	require.NoError(t, err)
	require.Equal(t, []Record{{Time: 1, Verb: "CHECK", Total: 2}}, got)
	require.Zero(t, tail.Bad)
}

// TestTailNoFileYet: a tail started before the plugin's first call reads
// the file from its start once it appears.
func TestTailNoFileYet(t *testing.T) {
	dir := t.TempDir()
	tail := NewTail(dir)
	got, err := tail.Read()
	require.NoError(t, err)
	require.Empty(t, got)
	require.NoError(t, Append(dir, rec("STATUS", 0)))
	got, err = tail.Read()
	require.NoError(t, err)
	require.Equal(t, []Record{rec("STATUS", 0)}, got)
}

// TestRotation: parallel writers past MaxSize rotate the file to .1 (the
// files stay within the bound, plus what writers racing the rotation
// append), and a tail reading between the
// writes gets every record exactly once, including the ones written to
// the old file before it moved.
func TestRotation(t *testing.T) {
	dir := t.TempDir()
	tail := NewTail(dir)
	line := len(`{"t":1,"verb":"ADD","code":0,"ms":1.5,"phases":{"parse":0.1}}`) + 1
	perWriter := 3 * MaxSize / line / 4 // 4 writers: 3*MaxSize in all, more than one rotation
	var wg sync.WaitGroup
	seen := 0
	var mu sync.Mutex
	read := func() {
		mu.Lock()
		defer mu.Unlock()
		got, err := tail.Read()
		require.NoError(t, err)
		seen += len(got)
	}
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWriter; i++ {
				require.NoError(t, Append(dir, rec("ADD", 0)))
				if i%200 == 0 {
					read()
				}
			}
		}()
	}
	wg.Wait()
	read()
	require.Equal(t, 4*perWriter, seen)
	require.Zero(t, tail.Bad)
	for _, name := range []string{File, File + ".1"} {
		st, err := os.Stat(Path(dir) + strings.TrimPrefix(name, File))
		require.NoError(t, err, name)
		// Over by what writers that opened it before the rotation add.
		require.LessOrEqual(t, st.Size(), int64(MaxSize+16*line), name)
	}
}

// A rotation between Read's look at .1 and its look at the file: what the
// rotated file got since the last Read is still read, once, then the new
// file. (TestRotation lost such records once in CI.)
func TestRotationBetweenStats(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, Append(dir, rec("ADD", 0)))
	tail := NewTail(dir)
	require.NoError(t, Append(dir, rec("ADD", 1)))
	got, err := tail.Read()
	require.NoError(t, err)
	require.Equal(t, []Record{rec("ADD", 1)}, got)
	require.NoError(t, Append(dir, rec("DEL", 0)))
	betweenStats = func() {
		betweenStats = nil
		require.NoError(t, os.Rename(Path(dir), Path(dir)+".1"))
		require.NoError(t, Append(dir, rec("CHECK", 0)))
	}
	defer func() { betweenStats = nil }()
	got, err = tail.Read()
	require.NoError(t, err)
	require.Equal(t, []Record{rec("DEL", 0), rec("CHECK", 0)}, got)
	got, err = tail.Read()
	require.NoError(t, err)
	require.Empty(t, got)
	require.Zero(t, tail.Bad)
}
