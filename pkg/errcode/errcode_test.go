package errcode

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const cniTypes = "github.com/containernetworking/cni/pkg/types"

// errName is the name of an error code constant (not of a type, Error).
var errName = regexp.MustCompile(`^Err[A-Z]`)

// TestCodesUnique: no two entries share a code or a name.
func TestCodesUnique(t *testing.T) {
	codes, names := map[uint]string{}, map[string]bool{}
	for _, c := range Codes {
		require.NotContains(t, codes, c.Code, "code %d: %s and %s", c.Code, codes[c.Code], c.Name)
		codes[c.Code] = c.Name
		require.False(t, names[c.Name], "name %s twice", c.Name)
		names[c.Name] = true
		require.NotEmpty(t, c.Meaning, c.Name)
		require.NotEmpty(t, c.Docs, c.Name)
		if c.Code >= 100 && c.Code < 999 {
			require.NotEmpty(t, c.Owner, "%s: a code of the project's has an owner", c.Name)
		}
	}
}

// TestConstantsRegistered: every constant of this package is an entry of
// Codes under its name and value, and every entry of the project's own is
// a constant.
func TestConstantsRegistered(t *testing.T) {
	consts := map[string]uint{}
	f, err := parser.ParseFile(token.NewFileSet(), "errcode.go", nil, 0)
	require.NoError(t, err)
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if !n.IsExported() {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				require.True(t, ok, "%s: an integer literal", n.Name)
				v, err := strconv.ParseUint(lit.Value, 0, 32)
				require.NoError(t, err)
				consts[n.Name] = uint(v)
			}
		}
	}
	require.NotEmpty(t, consts)
	for name, v := range consts {
		found := false
		for _, c := range Codes {
			if c.Name == name {
				require.Equal(t, v, c.Code, name)
				found = true
			}
		}
		require.True(t, found, "constant %s (%d) has no entry in Codes", name, v)
	}
	for _, c := range Codes {
		if !strings.HasPrefix(c.Name, "Err") {
			require.Contains(t, consts, c.Name, "entry %s is no constant of this package", c.Name)
		}
	}
}

// TestCodesDocumented: each entry has a row in the error table of every
// page it names, and each row of those tables is an entry naming that page.
func TestCodesDocumented(t *testing.T) {
	row := regexp.MustCompile(`^\| ([0-9]+) \|`)
	pages := map[string]map[uint]bool{}
	for _, c := range Codes {
		for _, p := range c.Docs {
			pages[p] = nil
		}
	}
	for p := range pages {
		f, err := os.Open(filepath.Join("../../docs", p))
		require.NoError(t, err)
		rows := map[uint]bool{}
		in := false
		s := bufio.NewScanner(f)
		for s.Scan() {
			switch line := s.Text(); {
			case line == "## Error codes":
				in = true
			case strings.HasPrefix(line, "## "):
				in = false
			case in:
				if m := row.FindStringSubmatch(line); m != nil {
					v, _ := strconv.Atoi(m[1])
					rows[uint(v)] = true
				}
			}
		}
		require.NoError(t, s.Err())
		f.Close()
		require.NotEmpty(t, rows, "docs/%s has no table under ## Error codes", p)
		pages[p] = rows
	}
	for _, c := range Codes {
		for _, p := range c.Docs {
			require.True(t, pages[p][c.Code], "code %d (%s) has no row in docs/%s", c.Code, c.Name, p)
			delete(pages[p], c.Code)
		}
	}
	for p, rows := range pages {
		for v := range rows {
			t.Errorf("docs/%s documents code %d, which pkg/errcode does not list for that page", p, v)
		}
	}
}

// TestNoCodeOutsideRegistry: no other package declares a code (a constant
// or variable Err* of an integer) or returns a literal one, and every
// well-known code the code uses (cni/pkg/types.Err*) is in Codes.
func TestNoCodeOutsideRegistry(t *testing.T) {
	known := map[string]bool{}
	for _, c := range Codes {
		known[c.Name] = true
	}
	fset := token.NewFileSet()
	seen := 0
	for _, root := range []string{"../../pkg", "../../cmd"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") ||
				filepath.Base(filepath.Dir(path)) == "errcode" {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			seen++
			alias := ""
			for _, im := range f.Imports {
				if p, _ := strconv.Unquote(im.Path.Value); p == cniTypes {
					alias = "types"
					if im.Name != nil {
						alias = im.Name.Name
					}
				}
			}
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.ValueSpec:
					for i, name := range n.Names {
						if errName.MatchString(name.Name) && i < len(n.Values) {
							if lit, ok := n.Values[i].(*ast.BasicLit); ok && lit.Kind == token.INT {
								t.Errorf("%s: %s = %s: declare error codes in pkg/errcode", fset.Position(name.Pos()), name.Name, lit.Value)
							}
						}
					}
				case *ast.CallExpr:
					if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "NewError" && len(n.Args) > 0 {
						if lit, ok := n.Args[0].(*ast.BasicLit); ok && lit.Kind == token.INT {
							t.Errorf("%s: NewError(%s, ...): use a pkg/errcode constant", fset.Position(n.Pos()), lit.Value)
						}
					}
				case *ast.SelectorExpr:
					if x, ok := n.X.(*ast.Ident); ok && alias != "" && x.Name == alias &&
						errName.MatchString(n.Sel.Name) && !known[n.Sel.Name] {
						t.Errorf("%s: %s.%s is a code pkg/errcode does not list", fset.Position(n.Pos()), alias, n.Sel.Name)
					}
				}
				return true
			})
			return nil
		})
		require.NoError(t, err)
	}
	require.NotZero(t, seen)
}
