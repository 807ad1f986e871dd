package testbuild_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/polyloop/polyloop/internal/testbuild"
)

// TestAProgramIsBuiltAsTheTestBinaryWas: a program Build makes carries the
// race detector exactly when this test binary does, as go version -m
// reads its build settings back.
func TestAProgramIsBuiltAsTheTestBinaryWas(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program")
	}
	dir := t.TempDir()
	if err := testbuild.Build(dir, nil, "github.com/polyloop/polyloop/cmd/polyloop-benchtable"); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("go", "version", "-m", filepath.Join(dir, "polyloop-benchtable")).Output()
	if err != nil {
		t.Fatal(err)
	}
	raced := strings.Contains(string(out), "-race=true")
	if want := len(testbuild.Flags()) == 1; raced != want {
		t.Fatalf("the program was built with the race detector: %t; the test binary: %t\n%s", raced, want, out)
	}
	t.Logf("race detector: %t", raced)
	// A race-built program would sleep a second at exit without it.
	if sleeps := strings.Contains(os.Getenv("GORACE"), "atexit_sleep_ms=0"); sleeps != raced {
		t.Fatalf("GORACE=%q after a build with the race detector %t", os.Getenv("GORACE"), raced)
	}
}

// TestABuildThatFailsSaysWhy: the go command's output is in the error.
func TestABuildThatFailsSaysWhy(t *testing.T) {
	err := testbuild.Build(t.TempDir(), nil, "github.com/polyloop/polyloop/no/such/package")
	if err == nil || !strings.Contains(err.Error(), "no/such/package") {
		t.Fatalf("building a package that does not exist: %v", err)
	}
}
