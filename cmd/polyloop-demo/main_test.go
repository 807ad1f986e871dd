package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/projections"
	"github.com/polyloop/polyloop/recovery"
)

// TestDemoRunsOfflineToCompletion: the demo's agent finishes with
// task_completed on a fresh store, printing a line per step as it goes,
// and the store holds a sound log.
func TestDemoRunsOfflineToCompletion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "demo.db")
	out := captureStdout(t, func() {
		if err := run(path, "demo-test"); err != nil {
			t.Fatal(err)
		}
	})
	if !strings.Contains(out, "task_completed after 5 steps") || !strings.Contains(out, path) {
		t.Fatalf("output:\n%s", out)
	}
	// A line per step as it became durable, before the result.
	steps, _, _ := strings.Cut(out, "run demo-test stopped")
	if strings.Count(steps, "\ndemo-test step ")+strings.Count(steps[:min(len(steps), 15)], "demo-test step ") != 5 ||
		!strings.HasPrefix(steps, "demo-test step 0: tool ") {
		t.Fatalf("want a line per step before the result; output:\n%s", out)
	}
	s, err := kv.Open(path, kv.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	stream, err := s.Load(context.Background(), "demo-test")
	if err != nil {
		t.Fatal(err)
	}
	if err := recovery.Check("demo-test", stream); err != nil {
		t.Fatal(err)
	}
	if r, ok := projections.Fold(stream).Result(); !ok || r.StopReason != "task_completed" {
		t.Fatalf("result %+v", r)
	}
}

func captureStdout(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	done := make(chan []byte)
	go func() {
		var b bytes.Buffer
		io.Copy(&b, r)
		done <- b.Bytes()
	}()
	defer func() { os.Stdout = old }()
	f()
	w.Close()
	os.Stdout = old
	return string(<-done)
}
