package layers_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/features"
)

// The C side has layers too. Every header under bpf/lib opens with the line
// that says whose it is:
//
//	/* owner: feature <name> */  one feature's (its name in pkg/features)
//	/* owner: shared */          a building block below the features: what
//	                             two features share (a map, a parser)
//	/* owner: core */            what the programs share above the features
//	                             (delivery into a pod): it calls them
//
// and includes only what its owner may: a feature's header shared headers
// and its own feature's, a shared header shared headers only, a core header
// anything. The programs (bpf/*.c) include what they need.
const bpfLib = "../../bpf/lib"

// ownerLine is the first line of a header under bpf/lib.
var ownerLine = regexp.MustCompile(`^/\* owner: (shared|core|feature ([A-Za-z]+)) \*/$`)

// includeLine is a quoted #include: a header of the project.
var includeLine = regexp.MustCompile(`^\s*#\s*include\s+"([^"]+)"`)

// owner is what a header's owner line says: "shared", "core" or
// "feature <name>".
type owner struct {
	kind    string // shared, core, feature
	feature string
}

func (o owner) String() string {
	if o.kind == "feature" {
		return "feature " + o.feature
	}
	return o.kind
}

// mayInclude says whether a header owned by o may include one owned by p.
func (o owner) mayInclude(p owner) bool {
	switch o.kind {
	case "core":
		return true
	case "shared":
		return p.kind == "shared"
	default:
		return p.kind == "shared" || p == o
	}
}

// bpfHeaders reads the owner and the project includes of every header of
// dir; bad lists the headers without a valid owner line.
func bpfHeaders(t *testing.T, dir string) (owners map[string]owner, includes map[string][]string, bad []string) {
	known := map[string]bool{}
	for _, f := range features.All {
		known[f.Name()] = true
	}
	paths, err := filepath.Glob(filepath.Join(dir, "*.h"))
	require.NoError(t, err)
	require.NotEmpty(t, paths, "no headers in %s", dir)
	owners = map[string]owner{}
	includes = map[string][]string{}
	for _, path := range paths {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		name := filepath.Base(path)
		lines := strings.Split(string(b), "\n")
		m := ownerLine.FindStringSubmatch(lines[0])
		switch {
		case m == nil:
			bad = append(bad, fmt.Sprintf("bpf/lib/%s: its first line says whose it is: /* owner: feature <name> */, /* owner: shared */ or /* owner: core */ (found %q)", name, lines[0]))
		case m[2] != "" && !known[m[2]]:
			bad = append(bad, fmt.Sprintf("bpf/lib/%s: owner feature %s: no feature has that name (pkg/features)", name, m[2]))
		case m[2] != "":
			owners[name] = owner{kind: "feature", feature: m[2]}
		default:
			owners[name] = owner{kind: m[1]}
		}
		for _, l := range lines {
			if inc := includeLine.FindStringSubmatch(l); inc != nil {
				includes[name] = append(includes[name], inc[1])
			}
		}
	}
	return owners, includes, bad
}

// bpfIncludeViolations are the includes of dir's headers against the rule.
func bpfIncludeViolations(t *testing.T, dir string) []string {
	owners, includes, bad := bpfHeaders(t, dir)
	for name, incs := range includes {
		o, ok := owners[name]
		if !ok {
			continue // reported: no owner
		}
		for _, inc := range incs {
			if strings.HasPrefix(inc, "../include/") {
				continue // bpf/include: the types every side shares
			}
			p, ok := owners[inc]
			if !ok {
				if _, err := os.Stat(filepath.Join(dir, inc)); err != nil {
					bad = append(bad, fmt.Sprintf("bpf/lib/%s includes %q: no such header in bpf/lib", name, inc))
				}
				continue
			}
			if !o.mayInclude(p) {
				bad = append(bad, fmt.Sprintf("bpf/lib/%s (%s) includes %s (%s): %s", name, o, inc, p, why(o)))
			}
		}
	}
	sort.Strings(bad)
	return bad
}

func why(o owner) string {
	if o.kind == "shared" {
		return "a shared header includes only shared headers (a feature's or the core's is above it)"
	}
	return "a feature's header includes only shared headers and its own feature's: move what both use into a shared header"
}

// TestBPFHeadersIncludeNoOtherFeature: no header of one feature includes
// another feature's (or a core header), and no shared header includes a
// feature's or a core header.
func TestBPFHeadersIncludeNoOtherFeature(t *testing.T) {
	if bad := bpfIncludeViolations(t, bpfLib); len(bad) > 0 {
		t.Fatalf("includes against the owners of bpf/lib's headers (test/layers):\n%s", strings.Join(bad, "\n"))
	}
}

// TestBPFHeaderRule: the rule catches what it is for, on headers made up
// for it.
func TestBPFHeaderRule(t *testing.T) {
	dir := t.TempDir()
	write := func(name, owner string, includes ...string) {
		s := owner + "\n"
		for _, inc := range includes {
			s += "#include \"" + inc + "\"\n"
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644))
	}
	write("a.h", "/* owner: feature masquerade */", "../include/types.h", "shared.h", "a2.h")
	write("a2.h", "/* owner: feature masquerade */", "b.h")
	write("b.h", "/* owner: feature hostPort */", "shared.h")
	write("shared.h", "/* owner: shared */", "core.h")
	write("core.h", "/* owner: core */", "a.h", "b.h", "shared.h")
	write("none.h", "/* hostPort */")
	write("typo.h", "/* owner: feature masqurade */")
	write("gone.h", "/* owner: shared */", "missing.h")
	require.Equal(t, []string{
		`bpf/lib/a2.h (feature masquerade) includes b.h (feature hostPort): a feature's header includes only shared headers and its own feature's: move what both use into a shared header`,
		`bpf/lib/gone.h includes "missing.h": no such header in bpf/lib`,
		`bpf/lib/none.h: its first line says whose it is: /* owner: feature <name> */, /* owner: shared */ or /* owner: core */ (found "/* hostPort */")`,
		`bpf/lib/shared.h (shared) includes core.h (core): a shared header includes only shared headers (a feature's or the core's is above it)`,
		`bpf/lib/typo.h: owner feature masqurade: no feature has that name (pkg/features)`,
	}, bpfIncludeViolations(t, dir))
}
