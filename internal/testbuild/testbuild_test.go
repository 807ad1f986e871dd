package testbuild_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/polyloop/polyloop/internal/testbuild"
)

// TestAProgramIsBuiltAsTheTestBinaryWas: a program Build makes carries
// the build flags this test binary carries (the race detector, -gcflags,
// -ldflags, -tags, -trimpath), as go version -m reads them back from
// both — with GOFLAGS, which make ci sets and a child go command would
// otherwise inherit, emptied for the build, and GORACE too (make ci sets
// the atexit_sleep_ms=0 Build must add itself).
func TestAProgramIsBuiltAsTheTestBinaryWas(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program")
	}
	dir := t.TempDir()
	t.Setenv("GOFLAGS", "")
	t.Setenv("GORACE", "")
	if err := testbuild.Build(dir, nil, "github.com/polyloop/polyloop/cmd/polyloop-benchtable"); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	want, got := buildFlags(t, self), buildFlags(t, filepath.Join(dir, "polyloop-benchtable"))
	if !slices.Equal(got, want) {
		t.Fatalf("the program was built with %q; the test binary with %q", got, want)
	}
	t.Logf("built with %q", got)
	// A race-built program would sleep a second at exit without it.
	raced := slices.Contains(got, "-race=true")
	if sleeps := strings.Contains(os.Getenv("GORACE"), "atexit_sleep_ms=0"); sleeps != raced {
		t.Fatalf("GORACE=%q after a build with the race detector %t", os.Getenv("GORACE"), raced)
	}
}

// buildFlags is what go version -m reads from the binary at path of the
// flags Build copies: "-race=true", "-gcflags=…" and so on, in its order,
// as it prints them (a value holding a space in quotes).
func buildFlags(t *testing.T, path string) []string {
	out, err := exec.Command("go", "version", "-m", path).Output()
	if err != nil {
		t.Fatalf("go version -m %s: %v", path, err)
	}
	var flags []string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.SplitN(strings.TrimSpace(l), "\t", 2)
		if len(f) != 2 || f[0] != "build" {
			continue
		}
		for _, name := range []string{"-race=", "-gcflags=", "-ldflags=", "-tags=", "-trimpath="} {
			if strings.HasPrefix(f[1], name) && f[1] != "-race=false" && f[1] != "-trimpath=false" {
				flags = append(flags, f[1])
			}
		}
	}
	return flags
}

// TestABuildThatFailsSaysWhy: the go command's output is in the error.
func TestABuildThatFailsSaysWhy(t *testing.T) {
	err := testbuild.Build(t.TempDir(), nil, "github.com/polyloop/polyloop/no/such/package")
	if err == nil || !strings.Contains(err.Error(), "no/such/package") {
		t.Fatalf("building a package that does not exist: %v", err)
	}
}
