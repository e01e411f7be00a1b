package agent

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	gobuildinfo "debug/buildinfo"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ebpf-cni/ebpf-cni/pkg/conflist"
)

// InstallRecord is the file in the node's CNI bin dir where Install lists
// what it wrote on the node, and Uninstall reads what to remove: beside
// the plugins, a dot file runtimes ignore, as make install's
// .ebpf-cni.installed (deploy/install.sh).
//
// It is a file of its own, not make install's: each side reads only what
// it can trust. make install's names node paths (/opt/cni/bin/ebpf-cni,
// with DESTDIR in front at uninstall); this container sees the node's
// directories elsewhere (/host/opt/cni/bin) and does not know their node
// paths, so this record names each file by its directory's role and its
// name. And each installer removes what it wrote: make uninstall leaves
// what the DaemonSet wrote, and the DaemonSet's uninstall what make
// install wrote (a node has one or the other; where both wrote a file,
// the first uninstall removes it and the second finds it gone).
const InstallRecord = ".ebpf-cni-agent.installed"

// The directories a record entry lies in.
const (
	recordBin  = "bin"  // the CNI bin dir
	recordConf = "conf" // the CNI conf dir
)

// recordHeader is the record's first line.
const recordHeader = "# ebpf-cni-agent install: the files it wrote on this node; ebpf-cni-agent uninstall removes them"

// recordEntry is one file Install wrote: "bin ebpf-cni", "conf
// 10-ebpf-cni.conflist", "bin loopback sha256=<hex>".
type recordEntry struct {
	Dir  string // recordBin or recordConf
	Name string // a file name, no directory
	// SHA256 is the content Install found or put there, for loopback
	// only: a file of that name is anybody's, and another installer (a
	// distribution package) may replace ours later. Uninstall removes it
	// only while its content is one ebpf-cni wrote.
	SHA256 string
}

func (e recordEntry) String() string {
	if e.SHA256 != "" {
		return e.Dir + " " + e.Name + " sha256=" + e.SHA256
	}
	return e.Dir + " " + e.Name
}

// installRecord is the record's entries, in the order first written.
type installRecord []recordEntry

// readRecord reads binDir's record; none is an empty record. A line it
// does not know fails: a record edited by hand must not make uninstall
// guess, and a name with a directory in it (../) is refused.
func readRecord(binDir string) (installRecord, error) {
	path := filepath.Join(binDir, InstallRecord)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the install record: %w", err)
	}
	var rec installRecord
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		e, ok := parseEntry(line)
		if !ok {
			return nil, fmt.Errorf("%s line %d: unexpected %q (want \"bin NAME\", \"bin NAME sha256=HEX\" or \"conf NAME\")", path, n, line)
		}
		rec.add(e)
	}
	return rec, sc.Err()
}

// parseEntry reads one line of the record.
func parseEntry(line string) (recordEntry, bool) {
	f := strings.Fields(line)
	if len(f) < 2 || len(f) > 3 {
		return recordEntry{}, false
	}
	e := recordEntry{Dir: f[0], Name: f[1]}
	if e.Dir != recordBin && e.Dir != recordConf {
		return e, false
	}
	if e.Name == "." || e.Name == ".." || strings.ContainsRune(e.Name, '/') || e.Name == InstallRecord {
		return e, false
	}
	if len(f) == 3 {
		sum, ok := strings.CutPrefix(f[2], "sha256=")
		if _, err := hex.DecodeString(sum); !ok || err != nil || len(sum) != 2*sha256.Size || e.Dir != recordBin {
			return e, false
		}
		e.SHA256 = sum
	}
	return e, true
}

// add appends e unless the record has it.
func (r *installRecord) add(e recordEntry) {
	if !slices.Contains(*r, e) {
		*r = append(*r, e)
	}
}

// sums are the contents the record lists for the bin dir's file name.
func (r installRecord) sums(name string) []string {
	var out []string
	for _, e := range r {
		if e.Dir == recordBin && e.Name == name && e.SHA256 != "" {
			out = append(out, e.SHA256)
		}
	}
	return out
}

// save writes the record into binDir, through a temporary file and a
// rename: a crash leaves the old record or the new one.
func (r installRecord) save(binDir string) error {
	var b strings.Builder
	b.WriteString(recordHeader + "\n")
	for _, e := range r {
		b.WriteString(e.String() + "\n")
	}
	if _, err := conflist.Write(binDir, InstallRecord, []byte(b.String()), true); err != nil {
		return fmt.Errorf("writing the install record: %w", err)
	}
	return nil
}

// sha256Of is the hex SHA-256 of data.
func sha256Of(data []byte) string {
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}

// versionFlag is what every build of ebpf-cni's Makefile passes to the
// Go linker (-ldflags "-X ...=<version>"), loopback's included.
const versionFlag = "-X github.com/ebpf-cni/ebpf-cni/pkg/buildinfo.Version="

// builtByEbpfCNI reports whether the loopback at path is one ebpf-cni's
// Makefile built (make install's, the image's of any release): Go records
// the linker flags among a binary's build settings, and every release's
// build stamps its version with versionFlag, also into loopback, which has
// no such variable. No other build of loopback names ebpf-cni's package.
// (A build with -trimpath records no linker flags: the Makefile must not
// add it, or this stops telling.)
func builtByEbpfCNI(path string) bool {
	bi, err := gobuildinfo.ReadFile(path)
	if err != nil || bi.Path != loopbackPackage {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-ldflags" && strings.Contains(s.Value, versionFlag) {
			return true
		}
	}
	return false
}

// loopbackPackage is the reference loopback's main package.
const loopbackPackage = "github.com/containernetworking/plugins/plugins/main/loopback"
