package soak_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestSoakRunNamesEverySoakedTest: make soak runs the tests SOAK_RUN (in
// the Makefile) selects, so a test that asks package soak for its count —
// or runs rapid in a package whose TestMain does — and is not selected
// would never run at its full count anywhere; so would one in a package
// make soak does not test.
func TestSoakRunNamesEverySoakedTest(t *testing.T) {
	root := filepath.Join("..", "..")
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^SOAK_RUN \?= (.+)$`).FindSubmatch(makefile)
	if m == nil {
		t.Fatal("the Makefile sets no SOAK_RUN")
	}
	run := regexp.MustCompile(string(m[1]))
	recipe := regexp.MustCompile(`(?m)^\tPOLYLOOP_SOAK=1 .*'\$\(SOAK_RUN\)'((?: \./\S+)+)$`).FindSubmatch(makefile)
	if recipe == nil {
		t.Fatal("the Makefile's soak target runs no packages with POLYLOOP_SOAK=1 -run '$(SOAK_RUN)'")
	}
	pkgs := map[string]bool{}
	for _, p := range strings.Fields(string(recipe[1])) {
		pkgs[filepath.Clean(p)] = true
	}

	type test struct{ name, file string }
	soaked := map[string][]test{} // by directory
	rapid := map[string][]test{}
	mainSoaks := map[string]bool{}
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "bench") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") || filepath.Dir(path) == "." {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		dir := filepath.Dir(path)
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || fn.Body == nil || !strings.HasPrefix(fn.Name.Name, "Test") {
				continue
			}
			uses := func(pkg string) bool {
				found := false
				ast.Inspect(fn.Body, func(n ast.Node) bool {
					if sel, ok := n.(*ast.SelectorExpr); ok {
						if id, ok := sel.X.(*ast.Ident); ok && id.Name == pkg {
							found = true
						}
					}
					return !found
				})
				return found
			}
			switch {
			case fn.Name.Name == "TestMain":
				mainSoaks[dir] = mainSoaks[dir] || uses("soak")
			case uses("soak"):
				soaked[dir] = append(soaked[dir], test{fn.Name.Name, path})
			case uses("rapid"):
				rapid[dir] = append(rapid[dir], test{fn.Name.Name, path})
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dir, ok := range mainSoaks {
		if ok {
			soaked[dir] = append(soaked[dir], rapid[dir]...)
		}
	}
	n := 0
	for dir, tests := range soaked {
		if filepath.Base(dir) == "soak" {
			continue // this package's own tests
		}
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		if !pkgs[rel] {
			t.Errorf("./%s holds soaked tests (%s…), and make soak does not test it", rel, tests[0].name)
		}
		for _, tc := range tests {
			n++
			if !run.MatchString(tc.name) {
				t.Errorf("%s (%s) asks package soak for its count, and the Makefile's SOAK_RUN %q does not select it", tc.name, tc.file, m[1])
			}
		}
	}
	if n == 0 {
		t.Fatal("found no test that asks package soak for its count")
	}
	t.Logf("%d soaked tests, each selected by SOAK_RUN", n)
}
