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
	"sync/atomic"
	"testing"
	"time"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// The peak-memory benchmark runs each scenario in a child process of the
// test binary and reads the child's peak resident set (VmHWM), so nothing
// else the test process did counts.
const (
	rssChildEnv = "POLYLOOP_RSS_CHILD" // the scenario
	rssStoreEnv = "POLYLOOP_RSS_STORE" // its store file
)

// rssChild runs a scenario and prints its peak RSS in KiB (VmHWM: the
// store file's mapped pages count in it), the peak of its private memory
// (RssAnon, sampled every millisecond) in KiB, and the characters of the
// largest prompt its runs sent the model (what the model must see).
func rssChild() int {
	ctx := context.Background()
	var anon atomic.Int64
	done := make(chan struct{})
	go func() {
		for {
			if kib := statusKiB("RssAnon:"); kib > anon.Load() {
				anon.Store(kib)
			}
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	var prompt atomic.Int64
	seen := func(r events.RunResult) {
		for _, st := range r.Steps {
			if int64(st.PromptChars) > prompt.Load() {
				prompt.Store(int64(st.PromptChars))
			}
		}
	}
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
				r, err := engine.Run(ctx, def, benchRequest(fmt.Sprint("c", w), 1000))
				if err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(4)
				}
				seen(r)
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
	case "large", "large-load": // the largest reply a run stores, a final answer; then (large-load) the run read back
		def := engine.Definition{Model: largeModel{}, Parser: seamstest.Parser{}, Store: store}
		r, err := engine.Run(ctx, def, benchRequest("large", 2))
		if err != nil || r.StopReason != events.StopAgentFinished {
			fmt.Fprintln(os.Stderr, "large:", r.StopReason, err)
			return 4
		}
		if os.Getenv(rssChildEnv) == "large-load" {
			if _, err := store.Load(ctx, "large"); err != nil {
				fmt.Fprintln(os.Stderr, "large: load:", err)
				return 4
			}
		}
	case "large-read": // a fresh process reading the large run back, as an inspector does
		if _, err := store.Load(ctx, "large"); err != nil {
			fmt.Fprintln(os.Stderr, "large-read:", err)
			return 4
		}
	case "resume":
		def := engine.Definition{Model: benchModel{steps: 10_000}, Parser: seamstest.Parser{}, Store: store}
		r, err := engine.Resume(ctx, def, benchRequest("long", 10_000))
		if err != nil {
			fmt.Fprintln(os.Stderr, "resume:", err)
			return 4
		}
		seen(r)
	}
	close(done)
	hwm := statusKiB("VmHWM:")
	if hwm < 0 {
		fmt.Fprintln(os.Stderr, "no VmHWM in /proc/self/status")
		return 5
	}
	fmt.Println(hwm, max(anon.Load(), statusKiB("RssAnon:")), prompt.Load())
	return 0
}

// largeModel's reply is a final answer as large as a reply may be
// (events.MaxTextBytes), compressible as LLM text is.
type largeModel struct{}

func (largeModel) Call(context.Context, seams.ModelCall) (events.ModelReply, error) {
	text := "FINAL: " + strings.Repeat("all work and no play ", events.MaxTextBytes/21+1)
	return events.ModelReply{Content: text[:events.MaxTextBytes]}, nil
}
func (largeModel) Parameters() map[string]string { return nil }

// statusKiB reads a "kB" field of /proc/self/status, or -1.
func statusKiB(field string) int64 {
	status, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err == nil {
				return n
			}
		}
	}
	return -1
}

// BenchmarkPeakRSS reports the peak resident memory (MiB) of 64 concurrent
// 1,000-step runs, of a run whose reply is as large as a run stores (and of
// reading that run back), and of resuming a 10,000-step run, beside an
// idle process's, each in its own child process.
func BenchmarkPeakRSS(b *testing.B) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		b.Skip("needs /proc")
	}
	dir := b.TempDir()
	// child runs scenario and returns its peak RSS and peak private
	// memory in MiB, and its largest prompt in KiB of characters.
	child := func(scenario, store string) (hwm, anon, prompt float64) {
		cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
		cmd.Env = append(os.Environ(), rssChildEnv+"="+scenario, rssStoreEnv+"="+store)
		out, err := cmd.Output()
		if err != nil {
			b.Fatalf("%s: %v", scenario, err)
		}
		if _, err := fmt.Sscan(string(out), &hwm, &anon, &prompt); err != nil {
			b.Fatalf("%s said %q", scenario, out)
		}
		return hwm / 1024, anon / 1024, prompt / 1024
	}
	long := filepath.Join(dir, "long.db")
	child("build", long)
	for b.Loop() {
		idle, anon, _ := child("idle", filepath.Join(dir, "idle.db"))
		b.ReportMetric(idle, "idle-MiB")
		b.ReportMetric(anon, "idle-anon-MiB")
		hwm, anon, prompt := child("concurrent", filepath.Join(dir, fmt.Sprint("c", b.N, ".db")))
		b.ReportMetric(hwm, "64x1000-MiB")
		b.ReportMetric(anon, "64x1000-anon-MiB")
		b.ReportMetric(prompt, "64x1000-prompt-KiB")
		// The largest reply a run stores: peak memory above an idle
		// process as a multiple of it, running the run, running it and
		// then reading it back, and reading it back in a fresh process.
		reply := float64(events.MaxTextBytes) / (1 << 20)
		hwm, anon, _ = child("large", filepath.Join(dir, fmt.Sprint("l", b.N, ".db")))
		b.ReportMetric(hwm, "large-MiB")
		b.ReportMetric(anon, "large-anon-MiB")
		b.ReportMetric((hwm-idle)/reply, "large-x-reply")
		hwm, _, _ = child("large-load", filepath.Join(dir, fmt.Sprint("ll", b.N, ".db")))
		b.ReportMetric(hwm, "large-load-MiB")
		b.ReportMetric((hwm-idle)/reply, "large-load-x-reply")
		hwm, _, _ = child("large-read", filepath.Join(dir, fmt.Sprint("l", b.N, ".db")))
		b.ReportMetric(hwm, "large-read-MiB")
		b.ReportMetric((hwm-idle)/reply, "large-read-x-reply")
		hwm, anon, prompt = child("resume", long)
		b.ReportMetric(hwm, "resume10000-MiB")
		b.ReportMetric(anon, "resume10000-anon-MiB")
		b.ReportMetric(prompt, "resume10000-prompt-KiB")
	}
}
