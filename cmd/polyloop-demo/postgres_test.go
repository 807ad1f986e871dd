package main

import (
	"context"
	"fmt"
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

// TestDemoNeverShowsAPassword: the demo, given a PostgreSQL store in each
// form a connection string takes (a URL, a URL with its scheme in
// capitals, a keyword/value string) with a password, runs on it and names
// it without the password; given one that cannot be reached, its error
// holds no password either.
func TestDemoNeverShowsAPassword(t *testing.T) {
	password, forms := pgtest.StoreForms(t)
	const secret = "Pa55-w0rd"
	t.Chdir(t.TempDir())
	for i, target := range forms {
		var err error
		out := captureStdout(t, func() { err = run(target, fmt.Sprint("demo-", i)) })
		if err != nil {
			t.Fatalf("form %d: %v", i, err)
		}
		if strings.Contains(out, password) || !strings.Contains(out, "store: ") || !strings.Contains(out, "xxxxx") {
			t.Errorf("form %d: output:\n%s", i, out)
		}
	}
	for _, target := range []string{
		"postgres://agent:" + secret + "@127.0.0.1:1/db?sslmode=disable",
		"POSTGRES://agent:" + secret + "@127.0.0.1:1/db?sslmode=disable",
		"host=127.0.0.1 port=1 user=agent password='" + secret + "' sslmode=disable",
	} {
		var err error
		out := captureStdout(t, func() { err = run(target, "demo-x") })
		if err == nil || strings.Contains(err.Error()+out, secret) {
			t.Errorf("%s: %v\n%s", target, err, out)
		}
	}
}
