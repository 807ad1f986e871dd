package main

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/stores"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// syncBuffer is an io.Writer two goroutines share.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startWorker runs `work` until the returned stop is called; stop returns
// its exit status.
func startWorker(o *options, out *syncBuffer, extra ...string) (stop func() int) {
	ctx, cancel := context.WithCancel(context.Background())
	code := make(chan int, 1)
	go func() { code <- command(ctx, out, out, o, append([]string{"work"}, extra...)) }()
	return func() int {
		cancel()
		return <-code
	}
}

// statuses lists the store's runs by status.
func statuses(t *testing.T, db string) map[seams.RunStatus][]seams.RunInfo {
	t.Helper()
	s, err := stores.Open(context.Background(), db, stores.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	infos, err := s.Runs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[seams.RunStatus][]seams.RunInfo{}
	for _, info := range infos {
		out[info.Status] = append(out[info.Status], info)
	}
	return out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSubmittedRunsAreSharedByTwoWorkers: runs submitted from one command
// are driven by two workers (each with its own connections and owner, as
// two processes have): every run finishes, each by one of them.
func TestSubmittedRunsAreSharedByTwoWorkers(t *testing.T) {
	o := &options{db: pgtest.StoreURL(t), delay: 5 * time.Millisecond}
	var out syncBuffer
	if code := command(context.Background(), &out, &out, o, []string{"submit", "-n", "12"}); code != 0 {
		t.Fatalf("submit: exit %d: %s", code, out.String())
	}
	if got := statuses(t, o.db); len(got[seams.StatusAwaiting]) != 12 {
		t.Fatalf("after submit: %v, want 12 runs awaiting a worker", got)
	}
	var a, b syncBuffer
	stopA, stopB := startWorker(o, &a, "-concurrency", "4"), startWorker(o, &b, "-concurrency", "4")
	waitFor(t, "every run finished", func() bool { return len(statuses(t, o.db)[seams.StatusFinished]) == 12 })
	if ca, cb := stopA(), stopB(); ca != 0 || cb != 0 {
		t.Fatalf("workers exited %d and %d:\n%s\n%s", ca, cb, a.String(), b.String())
	}
	for _, info := range statuses(t, o.db)[seams.StatusFinished] {
		if info.StopReason != events.StopAgentFinished {
			t.Errorf("%s stopped %s", info.RunID, info.StopReason)
		}
	}
	both := a.String() + b.String()
	if n := strings.Count(both, "agent_finished"); n != 12 {
		t.Fatalf("the workers report %d finished runs, want 12:\n%s", n, both)
	}
	t.Logf("worker A finished %d runs, worker B %d", strings.Count(a.String(), "agent_finished"), strings.Count(b.String(), "agent_finished"))
}

// TestStoppingAWorkerCancelsNothing: a worker stopped mid-run gives its
// runs back unfinished (awaiting, none cancelled); a worker started later
// finishes them; cancel ends a run nobody drives at once.
func TestStoppingAWorkerCancelsNothing(t *testing.T) {
	o := &options{db: filepath.Join(t.TempDir(), "fleet.db"), delay: 20 * time.Millisecond}
	var out syncBuffer
	stop := startWorker(o, &out, "-submit", "6")
	waitFor(t, "a few steps", func() bool { return strings.Count(out.String(), "submitted") == 6 })
	time.Sleep(100 * time.Millisecond)
	if code := stop(); code != 0 {
		t.Fatalf("work: exit %d: %s", code, out.String())
	}
	got := statuses(t, o.db)
	if len(got[seams.StatusAwaiting])+len(got[seams.StatusFinished]) != 6 || len(got[seams.StatusAwaiting]) == 0 {
		t.Fatalf("after the stop: %v, want every unfinished run awaiting", got)
	}
	for _, info := range got[seams.StatusFinished] {
		if info.StopReason == events.StopCancelled {
			t.Fatalf("%s was cancelled by the worker's stop", info.RunID)
		}
	}
	victim := got[seams.StatusAwaiting][0].RunID
	out = syncBuffer{}
	if code := command(context.Background(), &out, &out, o, []string{"cancel", victim}); code != 0 || !strings.Contains(out.String(), "cancelled") {
		t.Fatalf("cancel: exit %d: %s", code, out.String())
	}
	// The file is the worker's while it works: count what it reports.
	left := len(got[seams.StatusAwaiting]) - 1
	out = syncBuffer{}
	stop = startWorker(o, &out)
	waitFor(t, "every run finished", func() bool { return strings.Count(out.String(), "agent_finished") == left })
	if code := stop(); code != 0 {
		t.Fatalf("work: exit %d: %s", code, out.String())
	}
	for _, info := range statuses(t, o.db)[seams.StatusFinished] {
		want := events.StopAgentFinished
		if info.RunID == victim {
			want = events.StopCancelled
		}
		if info.StopReason != want {
			t.Errorf("%s stopped %s, want %s", info.RunID, info.StopReason, want)
		}
	}
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
