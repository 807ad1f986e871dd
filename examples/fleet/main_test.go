package main

import (
	"context"
	"flag"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/polyloop/polyloop/pgstore/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// TestTwoWorkersOneRun: two workers (each with its own connections, as two
// processes have) start on one run at once: one finishes it, the other is
// told it is busy; a third, started later, finds the run finished.
func TestTwoWorkersOneRun(t *testing.T) {
	db := pgtest.StoreURL(t)
	ctx := context.Background()
	type result struct {
		code int
		out  string
	}
	results := make(chan result, 2)
	for range 2 {
		go func() {
			var out strings.Builder
			code := work(ctx, &out, db, "shared", 5*time.Millisecond)
			results <- result{code, out.String()}
		}()
	}
	finished, busy := 0, 0
	for range 2 {
		r := <-results
		switch {
		case r.code == 0 && strings.Contains(r.out, "task_completed after 13 steps"),
			r.code == 0 && strings.Contains(r.out, "agent_finished after 13 steps"):
			finished++
		case r.code == exitBusy:
			busy++
		default:
			t.Errorf("worker: exit %d: %s", r.code, r.out)
		}
	}
	if finished < 1 || finished+busy != 2 {
		t.Fatalf("%d finished, %d busy", finished, busy)
	}
	var out strings.Builder
	if code := work(ctx, &out, db, "shared", 0); code != 0 || !strings.Contains(out.String(), "after 13 steps") {
		t.Fatalf("a late worker: exit %d: %s", code, out.String())
	}
	t.Logf("%d finished, %d busy", finished, busy)
}

// TestHelpNeverShowsTheDatabasePassword: -h prints the flags' defaults,
// and $DATABASE_URL, which holds a password, is not one of them.
func TestHelpNeverShowsTheDatabasePassword(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://agent:Pa55-w0rd@db/agents")
	fs := flag.NewFlagSet("fleet", flag.ContinueOnError)
	var help strings.Builder
	fs.SetOutput(&help)
	flags(fs)
	if err := fs.Parse([]string{"-h"}); err != flag.ErrHelp || !strings.Contains(help.String(), "-db") {
		t.Fatalf("-h: %v\n%s", err, help.String())
	}
	if strings.Contains(help.String(), "Pa55-w0rd") {
		t.Fatalf("-h shows the password:\n%s", help.String())
	}
}
