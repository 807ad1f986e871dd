// Package polyloop_test holds the tree's import rules, checked with the go
// command as go/build's deps_test.go checks the standard library's. The
// module's root has no package of its own; `make check` runs this test.
package polyloop_test

import (
	"bufio"
	"bytes"
	"os/exec"
	"path"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/polyloop/polyloop"

// testSupport reports whether linking p puts test support in a program:
// the testing package, rapid, or a support package of this module —
// proptest and, by Go's convention (net/http/httptest, testing/fstest),
// every package whose name ends in "test" (seamstest, pgtest, kvtest).
func testSupport(p string) bool {
	switch {
	case p == "testing", p == "pgregory.net/rapid", strings.HasPrefix(p, "pgregory.net/rapid/"):
		return true
	case strings.HasPrefix(p, module+"/"):
		return strings.HasSuffix(path.Base(p), "test")
	}
	return false
}

// store reports whether p is a store or a store's database library.
func store(p string) bool {
	for _, s := range []string{module + "/kv", module + "/pgstore", module + "/stores", "go.etcd.io/bbolt", "github.com/jackc/pgx/v5"} {
		if p == s || strings.HasPrefix(p, s+"/") {
			return true
		}
	}
	return false
}

// engine reports whether p is the engine or a package of it.
func engine(p string) bool {
	return p == module+"/engine" || strings.HasPrefix(p, module+"/engine/")
}

// TestImportRules: what each group of packages may not link, directly or
// through another package (test files aside: go list -test=false).
func TestImportRules(t *testing.T) {
	rules := []struct {
		name      string
		patterns  []string
		forbidden func(string) bool
		what      string
	}{
		// A command or example is a program users run: test doubles and the
		// testing package have no place in it.
		{"binaries link no test support", []string{"./cmd/...", "./examples/..."}, testSupport, "test support"},
		// The engine reaches a store only through seams.RunStore.
		{"the engine links no store", []string{"./engine"}, store, "a store or a store's database library"},
		// The readers only read: a writer (the engine's Decide, say) is
		// handed to them by whoever mounts them (polyloop-admin serve).
		{"the readers link no engine", []string{"./report", "./viewer", "./cmd/polyloop-inspect"}, engine, "the engine"},
	}
	for _, r := range rules {
		t.Run(r.name, func(t *testing.T) {
			graph, roots := goList(t, r.patterns...)
			if len(roots) == 0 {
				t.Fatalf("go list found no packages for %s", strings.Join(r.patterns, " "))
			}
			for _, root := range roots {
				for _, chain := range forbiddenChains(graph, root, r.forbidden) {
					t.Errorf("%s links %s, which is %s: %s", short(root), short(chain[len(chain)-1]), r.what, strings.Join(mapShort(chain), " -> "))
				}
			}
		})
	}
}

// TestTheRulesSeeWhatTheyForbid: the predicates and the chain search,
// one row each, on a small graph.
func TestTheRulesSeeWhatTheyForbid(t *testing.T) {
	for _, c := range []struct {
		path                  string
		support, kind, engine bool
	}{
		{"testing", true, false, false},
		{"pgregory.net/rapid", true, false, false},
		{module + "/proptest", true, false, false},
		{module + "/seams/seamstest", true, false, false},
		{module + "/pgstore/pgtest", true, true, false},
		{module + "/kv", false, true, false},
		{module + "/kv/internal/boltformat", false, true, false},
		{module + "/stores", false, true, false},
		{"go.etcd.io/bbolt", false, true, false},
		{"github.com/jackc/pgx/v5/pgxpool", false, true, false},
		{module + "/seams", false, false, false},
		{module + "/engine", false, false, true},
		{module + "/engine/internal/x", false, false, true},
		{module + "/engines", false, false, false},
		{"net/http/httptest", false, false, false},
		{module + "/kvx", false, false, false},
	} {
		if testSupport(c.path) != c.support || store(c.path) != c.kind || engine(c.path) != c.engine {
			t.Errorf("%s: test support %t, store %t, engine %t; want %t, %t, %t", c.path, testSupport(c.path), store(c.path), engine(c.path),
				c.support, c.kind, c.engine)
		}
	}
	graph := map[string][]string{"a": {"b", "c"}, "b": {"testing"}, "c": {"b", "d"}, "d": nil, "testing": nil}
	got := forbiddenChains(graph, "a", testSupport)
	if want := [][]string{{"a", "b", "testing"}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("chains from a: %v, want %v", got, want)
	}
	if got := forbiddenChains(graph, "d", testSupport); len(got) != 0 {
		t.Errorf("chains from d: %v, want none", got)
	}
}

// goList returns the import graph of the packages the patterns match and
// their dependencies, without test files, and the matched packages.
func goList(t *testing.T, patterns ...string) (graph map[string][]string, roots []string) {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is not on PATH; the import rules are read with go list: %v", err)
	}
	args := append([]string{"list", "-deps", "-test=false", "-f", "{{.ImportPath}} {{.DepOnly}}{{range .Imports}} {{.}}{{end}}"}, patterns...)
	cmd := exec.Command(goCmd, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	graph = map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			t.Fatalf("go list printed %q, not a package and its imports", sc.Text())
		}
		graph[f[0]] = f[2:]
		if f[1] == "false" {
			roots = append(roots, f[0])
		}
	}
	return graph, roots
}

// forbiddenChains returns, for each forbidden package root links, the
// shortest import chain from root to it (breadth first; the chain stops at
// the first forbidden package on its way).
func forbiddenChains(graph map[string][]string, root string, forbidden func(string) bool) [][]string {
	from := map[string]string{root: ""}
	queue := []string{root}
	var found []string
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if forbidden(p) {
			found = append(found, p)
			continue
		}
		for _, q := range graph[p] {
			if _, seen := from[q]; !seen {
				from[q] = p
				queue = append(queue, q)
			}
		}
	}
	var chains [][]string
	for _, p := range found {
		var chain []string
		for q := p; q != ""; q = from[q] {
			chain = append(chain, q)
		}
		slices.Reverse(chain)
		chains = append(chains, chain)
	}
	return chains
}

func short(p string) string { return strings.TrimPrefix(p, module+"/") }

func mapShort(ps []string) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = short(p)
	}
	return out
}
