// Package testbuild builds the project's programs for the tests that run
// them as processes (polyloop-inspect's, the refund example's, the
// --version test). It builds them as the test binary itself was built —
// with the race detector, compiler and linker flags the test binary was
// built with — so a cold build cache compiles each package once for the
// whole test run rather than once more without them, which on two cores
// costs the README's test command minutes; and a program a test runs
// reports its own data races.
//
// What does not live here: running the programs (each test knows what it
// runs) and anything a non-test program links (package testbuild imports
// no testing support, and no command or example imports it).
package testbuild

import (
	"fmt"
	"os"
	"os/exec"
	"runtime/debug"
	"slices"
	"strings"
)

// Flags returns the go build flags that match the running binary's own
// build, as the go command recorded them in it: -race, -gcflags, -ldflags,
// -tags and -trimpath, whichever it was built with (make ci builds without
// debug information, and a program built with the compiler's defaults
// would miss the cache for every package). None when it recorded none.
func Flags() []string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return nil
	}
	var flags []string
	for _, s := range bi.Settings {
		switch s.Key {
		case "-race", "-trimpath":
			if s.Value == "true" {
				flags = append(flags, s.Key)
			}
		case "-gcflags", "-ldflags", "-tags":
			flags = append(flags, s.Key+"="+s.Value)
		}
	}
	return flags
}

// Build runs go build with Flags, then extra, writing the programs of
// pkgs into dir (-o dir/). Its error holds the go command's output.
//
// With the race detector, it also adds atexit_sleep_ms=0 to GORACE in
// this process's environment, which the programs the test starts
// inherit: a program built with the race detector otherwise sleeps a
// second before it exits. (The running test binary read GORACE when it
// started; the change does not touch it.)
func Build(dir string, extra []string, pkgs ...string) error {
	flags := Flags()
	if slices.Contains(flags, "-race") && !strings.Contains(os.Getenv("GORACE"), "atexit_sleep_ms") {
		os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	}
	args := append([]string{"build"}, flags...)
	args = append(args, extra...)
	args = append(args, "-o", dir+"/")
	args = append(args, pkgs...)
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("go %v: %v\n%s", args, err, out)
	}
	return nil
}
