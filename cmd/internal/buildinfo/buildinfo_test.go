package buildinfo

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/polyloop/polyloop/internal/testbuild"
)

// TestLine: each part of the build info in its place, and nothing of VCS
// when nothing was stamped.
func TestLine(t *testing.T) {
	main := debug.Module{Path: "github.com/polyloop/polyloop", Version: "v1.2.3"}
	vcs := func(kv ...string) []debug.BuildSetting {
		var s []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			s = append(s, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return s
	}
	for _, c := range []struct {
		name string
		info debug.BuildInfo
		want string
	}{
		{"released", debug.BuildInfo{GoVersion: "go1.26.0", Main: main},
			"x github.com/polyloop/polyloop v1.2.3 go1.26.0"},
		{"a clone, clean", debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: main.Path, Version: "(devel)"},
			Settings: vcs("vcs.revision", "abc123", "vcs.time", "2026-01-02T03:04:05Z", "vcs.modified", "false")},
			"x github.com/polyloop/polyloop (devel) (revision abc123, 2026-01-02T03:04:05Z) go1.26.0"},
		{"a clone, modified", debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: main.Path},
			Settings: vcs("vcs.revision", "abc123", "vcs.modified", "true")},
			"x github.com/polyloop/polyloop (devel) (revision abc123, modified) go1.26.0"},
	} {
		if got := line("x", &c.info); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// TestEveryCommandPrintsItsVersion: each command under cmd/, built as a
// user builds it, prints one line for --version — its name, the module,
// its version and the VCS revision the go command stamped into it (as
// `go version -m` reads them back) — and exits 0; its package doc, and
// its --help where it has one (polyloop-benchtable has none), say so.
// (The go command stamps no revision in a git worktree; a clone's
// binaries carry it.)
func TestEveryCommandPrintsItsVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the commands")
	}
	dir := t.TempDir()
	// -buildvcs=auto: what go build does by default, whatever GOFLAGS
	// this machine sets.
	if err := testbuild.Build(dir, []string{"-buildvcs=auto"}, "../../..."); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"polyloop-admin", "polyloop-benchtable", "polyloop-demo", "polyloop-inspect"} {
		bin := filepath.Join(dir, name)
		src, err := os.ReadFile(filepath.Join("..", "..", name, "main.go"))
		if err != nil {
			t.Fatal(err)
		}
		if doc, _, _ := strings.Cut(string(src), "\npackage main"); !strings.Contains(doc, "-version") {
			t.Errorf("%s: its package doc does not mention --version", name)
		}
		if name != "polyloop-benchtable" {
			help, _ := exec.Command(bin, "--help").CombinedOutput()
			if !strings.Contains(string(help), "-version") {
				t.Errorf("%s --help does not mention --version:\n%s", name, help)
			}
		}
		out, err := exec.Command(bin, "--version").CombinedOutput()
		if err != nil {
			t.Errorf("%s --version: %v\n%s", name, err, out)
			continue
		}
		stamped, err := exec.Command("go", "version", "-m", bin).Output()
		if err != nil {
			t.Fatal(err)
		}
		want := []string{name + " github.com/polyloop/polyloop "}
		for _, l := range strings.Split(string(stamped), "\n") {
			f := strings.Fields(l)
			switch {
			case len(f) >= 3 && f[0] == "mod":
				want = append(want, " "+f[2]+" ")
			case len(f) == 2 && strings.HasPrefix(f[1], "vcs.revision="):
				want = append(want, "(revision "+strings.TrimPrefix(f[1], "vcs.revision="))
			}
		}
		for _, w := range want {
			if !strings.Contains(string(out), w) || strings.Count(string(out), "\n") != 1 || !strings.HasPrefix(string(out), want[0]) {
				t.Errorf("%s --version printed %q, want one line starting %q holding %q", name, out, want[0], want[1:])
				break
			}
		}
	}
}
