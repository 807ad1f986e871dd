package otelsink_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/otelsink"
	"github.com/polyloop/polyloop/proptest"
)

const (
	childStore = "OTELSINK_CHILD_STORE" // the child runs the agent on this file
	childSpans = "OTELSINK_CHILD_SPANS" // and writes its spans here
	childCrash = "OTELSINK_CHILD_CRASH" // crashing after this many appends
	childDies  = "OTELSINK_CHILD_DIES"  // and then exiting without a Shutdown
)

func TestMain(m *testing.M) {
	if os.Getenv(childStore) != "" {
		os.Exit(runChild())
	}
	os.Exit(m.Run())
}

// lineExporter writes "trace span name" per span to a file.
type lineExporter struct {
	mu   sync.Mutex
	path string
}

func (e *lineExporter) ExportSpans(_ context.Context, ss []sdktrace.ReadOnlySpan) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	f, err := os.OpenFile(e.path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, s := range ss {
		fmt.Fprintf(f, "%s %s %s\n", s.SpanContext().TraceID(), s.SpanContext().SpanID(), s.Name())
	}
	return nil
}
func (e *lineExporter) Shutdown(context.Context) error { return nil }

// runChild is the first process: it runs the agent until its store
// "crashes", exports its spans and exits — or, with childDies, exits as a
// killed process does, its batch processor's spans lost.
func runChild() int {
	store, err := kv.Open(os.Getenv(childStore), kv.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	defer store.Close()
	var after int
	fmt.Sscan(os.Getenv(childCrash), &after)
	sink := otelsink.New(&lineExporter{path: os.Getenv(childSpans)}, otelsink.Options{})
	def, req := agent(&proptest.CrashingStore{Inner: store, After: after}, sink, script())
	_, err = engine.Run(context.Background(), def, req)
	if os.Getenv(childDies) == "" {
		sink.Shutdown(context.Background())
	}
	if !errors.Is(err, proptest.ErrCrashed) {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 4
	}
	return 0
}

// TestAResumeInAnotherProcessContinuesTheTrace: a child process runs the
// agent until it crashes; this process resumes the run with its own sink.
// The spans of both processes form one trace holding every span; the
// resuming process exports all of them, those of the steps before the
// resume again (a span id twice, the same span), since the child may have
// died with them unexported — as it does when it exits without a
// Shutdown.
func TestAResumeInAnotherProcessContinuesTheTrace(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	for _, crash := range []int{2, 4} {
		for _, dies := range []bool{false, true} {
			dir := t.TempDir()
			path, spansFile := filepath.Join(dir, "s.db"), filepath.Join(dir, "spans")
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), childStore+"="+path, childSpans+"="+spansFile, fmt.Sprint(childCrash, "=", crash))
			if dies {
				cmd.Env = append(cmd.Env, childDies+"=1")
			}
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("child: %v\n%s", err, out)
			}
			b, _ := os.ReadFile(spansFile)
			var lines []string
			if len(b) > 0 {
				lines = strings.Split(strings.TrimSpace(string(b)), "\n")
			}
			exported := len(lines)
			store, err := kv.Open(path, kv.Options{})
			if err != nil {
				t.Fatal(err)
			}
			second := spans(t, otelsink.Options{Runs: store}, func(sink *otelsink.Sink) {
				def, req := agent(store, sink, script())
				if _, err := engine.Resume(context.Background(), def, req); err != nil {
					t.Fatal(err)
				}
			})
			store.Close()
			for _, s := range second {
				lines = append(lines, fmt.Sprintf("%s %s %s", s.SpanContext.TraceID(), s.SpanContext.SpanID(), s.Name))
			}
			names, trace := map[string]string{}, ""
			for _, l := range lines {
				f := strings.SplitN(l, " ", 3)
				if trace == "" {
					trace = f[0]
				}
				if name, seen := names[f[1]]; f[0] != trace || seen && name != f[2] {
					t.Fatalf("crash %d: spans of two traces or two spans of one id:\n%s", crash, strings.Join(lines, "\n"))
				}
				names[f[1]] = f[2]
			}
			if len(names) != 8 || len(second) != 8 {
				t.Fatalf("crash %d (child dies: %t): %d spans, %d from the resuming process, %d from the child",
					crash, dies, len(names), len(second), exported)
			}
			t.Logf("crash %d (child dies: %t): the child exported %d spans, the resuming process 8", crash, dies, exported)
		}
	}
}
