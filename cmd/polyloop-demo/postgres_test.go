package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/projections"
	"github.com/polyloop/polyloop/stores"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// TestDemoRunsOnPostgres: -store postgres://… runs the demo on PostgreSQL,
// prints the URL without a password, and leaves a sound, finished run.
func TestDemoRunsOnPostgres(t *testing.T) {
	url := pgtest.StoreURL(t)
	out := captureStdout(t, func() {
		if err := run(url, "demo-pg"); err != nil {
			t.Fatal(err)
		}
	})
	if !strings.Contains(out, "task_completed after 5 steps") || !strings.Contains(out, "store: postgres://") {
		t.Fatalf("output:\n%s", out)
	}
	s, err := stores.Open(context.Background(), url, stores.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	stream, err := s.Load(context.Background(), "demo-pg")
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := projections.Fold(stream).Result(); !ok || r.StopReason != "task_completed" {
		t.Fatalf("result %+v", r)
	}
}
