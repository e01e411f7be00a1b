// Command summary reads the serial console of the make test-kernel guest
// (kernel messages, and the tests' go test events as test2json lines),
// prints the tests' output as go test -v would while it arrives, and at the
// end a summary: every failed and skipped test with what it said (why it
// was skipped), and one closing line with the counts.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

type key struct{ pkg, test string }

type tally struct {
	output  map[key][]string // what each test printed, for the summary
	passed  int
	failed  []key
	skipped []key
}

func main() {
	kernel := flag.String("kernel", "", "kernel package, for the summary")
	flag.Parse()
	t := &tally{output: map[key][]string{}}
	t.read(os.Stdin, os.Stdout)
	t.print(os.Stdout, *kernel)
}

// read copies the console to w: test events as their output, anything else
// (kernel messages, the guest's own lines) as it is.
func (t *tally) read(r io.Reader, w io.Writer) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		// A kernel message may land in front of an event on the same line.
		i := strings.Index(line, `{"Time"`)
		if i < 0 {
			i = strings.Index(line, `{"Action"`)
		}
		var ev event
		if i < 0 || json.Unmarshal([]byte(line[i:]), &ev) != nil {
			fmt.Fprintln(w, line)
			continue
		}
		if i > 0 {
			fmt.Fprintln(w, line[:i])
		}
		k := key{ev.Package, ev.Test}
		switch ev.Action {
		case "output":
			fmt.Fprint(w, ev.Output)
			if ev.Test != "" {
				t.output[k] = append(t.output[k], ev.Output)
			}
		case "pass":
			if ev.Test != "" {
				t.passed++
				delete(t.output, k)
			}
		case "fail":
			if ev.Test != "" {
				t.failed = append(t.failed, k)
			}
		case "skip":
			if ev.Test != "" {
				t.skipped = append(t.skipped, k)
			}
		}
	}
}

func (t *tally) print(w io.Writer, kernel string) {
	fmt.Fprintf(w, "\n==== make test-kernel summary (%s)\n", kernel)
	sections := []struct {
		name string
		keys []key
	}{{"FAILED", t.failed}, {"SKIPPED", t.skipped}}
	for _, s := range sections {
		if len(s.keys) == 0 {
			continue
		}
		sort.Slice(s.keys, func(i, j int) bool {
			if s.keys[i].pkg != s.keys[j].pkg {
				return s.keys[i].pkg < s.keys[j].pkg
			}
			return s.keys[i].test < s.keys[j].test
		})
		fmt.Fprintf(w, "%s:\n", s.name)
		for _, k := range s.keys {
			fmt.Fprintf(w, "  %s %s\n", k.pkg, k.test)
			for _, o := range t.output[k] {
				o = strings.TrimSpace(o)
				// Only what the test said, not go test's own framing lines.
				if o == "" || strings.HasPrefix(o, "=== ") || strings.HasPrefix(o, "--- ") {
					continue
				}
				fmt.Fprintf(w, "      %s\n", o)
			}
		}
	}
	fmt.Fprintf(w, "%d passed, %d failed, %d skipped\n", t.passed, len(t.failed), len(t.skipped))
}
