package engine_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// The peak-memory benchmark runs each scenario in a child process of the
// test binary and reads the child's peak resident set (VmHWM), so nothing
// else the test process did counts.
const (
	rssChildEnv = "POLYLOOP_RSS_CHILD" // the scenario
	rssStoreEnv = "POLYLOOP_RSS_STORE" // its store file
)

// rssChild runs a scenario and prints its peak RSS in KiB.
func rssChild() int {
	ctx := context.Background()
	store, err := kv.Open(os.Getenv(rssStoreEnv), kv.Options{NoSync: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	defer store.Close()
	switch os.Getenv(rssChildEnv) {
	case "idle":
	case "concurrent": // 64 runs of 1,000 steps at once
		var wg sync.WaitGroup
		for w := range 64 {
			wg.Go(func() {
				def := engine.Definition{Model: benchModel{steps: 1000}, Parser: seamstest.Parser{}, Store: store}
				if _, err := engine.Run(ctx, def, benchRequest(fmt.Sprint("c", w), 1000)); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(4)
				}
			})
		}
		wg.Wait()
	case "build": // a 10,000-step run that crashes before its end
		crashing := &proptest.CrashingStore{Inner: store, After: 2 * 10_000}
		def := engine.Definition{Model: benchModel{steps: 10_000}, Parser: seamstest.Parser{}, Store: crashing}
		if _, err := engine.Run(ctx, def, benchRequest("long", 10_000)); !errors.Is(err, proptest.ErrCrashed) {
			fmt.Fprintln(os.Stderr, "build:", err)
			return 4
		}
	case "resume":
		def := engine.Definition{Model: benchModel{steps: 10_000}, Parser: seamstest.Parser{}, Store: store}
		if _, err := engine.Resume(ctx, def, benchRequest("long", 10_000)); err != nil {
			fmt.Fprintln(os.Stderr, "resume:", err)
			return 4
		}
	}
	status, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			fmt.Println(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return 0
		}
	}
	fmt.Fprintln(os.Stderr, "no VmHWM in /proc/self/status")
	return 5
}

// BenchmarkPeakRSS reports the peak resident memory (MiB) of 64 concurrent
// 1,000-step runs and of resuming a 10,000-step run, beside an idle
// process's, each in its own child process.
func BenchmarkPeakRSS(b *testing.B) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		b.Skip("needs /proc")
	}
	dir := b.TempDir()
	child := func(scenario, store string) float64 {
		cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
		cmd.Env = append(os.Environ(), rssChildEnv+"="+scenario, rssStoreEnv+"="+store)
		out, err := cmd.Output()
		if err != nil {
			b.Fatalf("%s: %v", scenario, err)
		}
		kib, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
		if err != nil {
			b.Fatalf("%s said %q", scenario, out)
		}
		return kib / 1024
	}
	long := filepath.Join(dir, "long.db")
	child("build", long)
	for b.Loop() {
		b.ReportMetric(child("idle", filepath.Join(dir, "idle.db")), "idle-MiB")
		b.ReportMetric(child("concurrent", filepath.Join(dir, fmt.Sprint("c", b.N, ".db"))), "64x1000-MiB")
		b.ReportMetric(child("resume", long), "resume10000-MiB")
	}
}
