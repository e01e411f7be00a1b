// Package calls is the plugin's record of its calls: one JSON line per
// CNI call (verb, CNI error code, total and per-phase milliseconds),
// appended to a bounded file under the stateDir, which the node agent
// tails for its metrics (pkg/agent/metrics). The plugin stays daemonless:
// with no agent the file only rotates; an agent started later counts the
// calls made from then on.
//
// Writing costs one open, one O_APPEND write and one fstat per call, no
// fsync: the record is history, never worth failing or slowing a call.
// When the file passes MaxSize the writer that noticed renames it to
// File+".1" (replacing the older one), holding an flock on it so that two
// writers never both rotate: both files stay near MaxSize (over it by the
// few records of writers that opened the file before it moved).
package calls

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// File is the record's name under the stateDir; File+".1" the one before.
const File = "calls.log"

// MaxSize is how large File grows before it is rotated (about 1,500 calls).
const MaxSize = 256 << 10

// Record is one call. Phases are the ones EBPF_CNI_TIMING prints (a name
// timed twice is summed); a call that failed before it opened the node has
// only the first ones.
type Record struct {
	Time   int64              `json:"t"`    // unix milliseconds at the end of the call
	Verb   string             `json:"verb"` // ADD, DEL, CHECK, STATUS, GC
	Code   uint               `json:"code"` // 0: success, else the CNI error code
	Total  float64            `json:"ms"`   // since the process started
	Phases map[string]float64 `json:"phases,omitempty"`
	// Healed is how many things the call's healing mended: records
	// rebuilt, attachments of gone pods reclaimed, leftovers removed.
	Healed int `json:"healed,omitempty"`
}

// Path is the record's path under stateDir.
func Path(stateDir string) string { return filepath.Join(stateDir, File) }

// Ms is d in milliseconds, to the microsecond.
func Ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Append adds r to the record under stateDir (which must exist: the
// plugin's node handle made it), rotating it when it is over MaxSize.
// Callers ignore the error; tests read it.
func Append(stateDir string, r Record) error {
	line, err := json.Marshal(r)
	if err != nil {
		return err
	}
	line = append(line, '\n')
	path := Path(stateDir)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	// One write: O_APPEND makes it land whole after every other writer's.
	if _, err := f.Write(line); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Size <= MaxSize {
		return err
	}
	return rotate(f, path, st.Ino)
}

// rotate renames path to path.1 if it still is the file f (inode ino).
// The flock serialises the writers that found it full: the first renames
// it, the others then find another file at path and leave it alone.
func rotate(f *os.File, path string, ino uint64) error {
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return nil // another writer is rotating it
	}
	defer unix.Flock(int(f.Fd()), unix.LOCK_UN) //nolint:errcheck
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil || st.Ino != ino {
		return nil // rotated meanwhile
	}
	return os.Rename(path, path+".1")
}

// Tail reads the records appended since it last looked, across
// rotations. It starts at the end of the file: what was written before
// the reader started is not counted (an agent that restarts does not count
// calls twice; a stopped agent loses their history only).
type Tail struct {
	path string
	// cur is the file at path as last read, prev the one rotated to .1: a
	// writer that opened it before the rename may still append to it.
	cur, prev pos
	// Bad counts the lines that were no record (none are written; a
	// truncated file could leave one).
	Bad int
}

// pos is how far a file (by inode) has been read.
type pos struct {
	ino uint64
	off int64
}

// NewTail reads the record under stateDir from its current end.
func NewTail(stateDir string) *Tail {
	t := &Tail{path: Path(stateDir)}
	var st unix.Stat_t
	if err := unix.Stat(t.path, &st); err == nil {
		t.cur = pos{st.Ino, st.Size}
	}
	return t
}

// Read returns the records appended since the last Read (or NewTail).
// A record still being written (no newline yet) waits for the next Read.
func (t *Tail) Read() ([]Record, error) {
	var out []Record
	var old unix.Stat_t
	oldErr := unix.Stat(t.path+".1", &old)
	if t.prev.ino != 0 && oldErr == nil && old.Ino == t.prev.ino {
		recs, err := t.read(t.path+".1", &t.prev)
		if err != nil {
			return nil, err
		}
		out = append(out, recs...)
	}
	if betweenStats != nil {
		betweenStats()
	}
	var st unix.Stat_t
	err := unix.Stat(t.path, &st)
	if err != nil && !errors.Is(err, syscall.ENOENT) {
		return nil, fmt.Errorf("reading %s: %w", t.path, err)
	}
	if err != nil || st.Ino != t.cur.ino {
		// Rotated (or not there yet): finish the file we were reading if it
		// is the one at .1 now, then read the new one from its start. .1 is
		// looked at again: a rotation since the look above moved the file
		// we were reading there.
		oldErr = unix.Stat(t.path+".1", &old)
		if t.cur.ino != 0 && oldErr == nil && old.Ino == t.cur.ino {
			recs, rerr := t.read(t.path+".1", &t.cur)
			if rerr != nil {
				return nil, rerr
			}
			out = append(out, recs...)
			t.prev = t.cur
		}
		t.cur = pos{}
		if err != nil {
			return out, nil
		}
		t.cur.ino = st.Ino
	}
	if st.Size < t.cur.off { // truncated in place: start again
		t.cur.off = 0
	}
	recs, err := t.read(t.path, &t.cur)
	return append(out, recs...), err
}

// betweenStats, when a test sets it, runs in Read between its look at .1
// and its look at the file: where a rotation is a race.
var betweenStats func()

// read parses the complete lines of path from p.off on and moves p.off
// past them. A file at path that is no longer p's (rotated since Read
// looked) is left for the next Read.
func (t *Tail) read(path string, p *pos) ([]Record, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if st.Ino != p.ino {
		return nil, nil
	}
	b, err := io.ReadAll(io.NewSectionReader(f, p.off, 4*MaxSize))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	end := bytes.LastIndexByte(b, '\n')
	if end < 0 {
		return nil, nil
	}
	var out []Record
	for _, line := range bytes.Split(b[:end], []byte{'\n'}) {
		var r Record
		if err := json.Unmarshal(line, &r); err != nil || r.Verb == "" {
			t.Bad++
			continue
		}
		out = append(out, r)
	}
	p.off += int64(end) + 1
	return out, nil
}
