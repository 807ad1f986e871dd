package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/projections"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
)

func cfg(t *testing.T) config {
	dir := t.TempDir()
	return config{store: filepath.Join(dir, "ta.db"), results: filepath.Join(dir, "results.json"), crashAfter: -1}
}

// TestReviewOffline: both phases complete; the rejected flag (a severity
// outside the schema's enum) is a step the model sees, not a finding.
func TestReviewOffline(t *testing.T) {
	c := cfg(t)
	var out strings.Builder
	if err := review(context.Background(), c, &out); err != nil {
		t.Fatal(err)
	}
	d, _ := (&results{path: c.results}).load()
	if len(d.Findings) != 2 || d.Summaries["review-1/triage"] != "lease-2024,nda-acme" {
		t.Fatalf("results %+v\n%s", d, out.String())
	}
	if !strings.Contains(out.String(), "phase review: task_completed after 6 steps") {
		t.Fatal(out.String())
	}
}

// TestInterruptedReviewResumes: the review phase is cut off after each of
// its durable writes in turn, then resumed. A finding is never written
// twice; a crash while a never tool ran stops honestly.
func TestInterruptedReviewResumes(t *testing.T) {
	for crash := 1; crash < 12; crash++ { // the phase writes 12 times
		c := cfg(t)
		store, err := kv.Open(c.store, kv.Options{})
		if err != nil {
			t.Fatal(err)
		}
		db := &results{path: c.results}
		all, _ := tools(db)
		ctx := context.Background()
		if r, err := runPhase(ctx, phases[0], all, db, store, c); err != nil || r.StopReason != events.StopTaskCompleted {
			t.Fatalf("triage: %v %v", r.StopReason, err)
		}
		crashing := &proptest.CrashingStore{Inner: store, After: crash}
		if _, err := runPhase(ctx, phases[1], all, db, crashing, c); !errors.Is(err, proptest.ErrCrashed) {
			t.Fatalf("crash %d: %v", crash, err)
		}
		stream, _ := store.Load(ctx, "review-1/review")
		verdict, err := recovery.Classify("review-1/review", stream)
		if err != nil {
			t.Fatal(err)
		}
		resumed := c
		resumed.resume = true
		r, err := runPhase(ctx, phases[1], all, db, store, resumed)
		store.Close()
		if err != nil {
			t.Fatalf("crash %d: %v", crash, err)
		}
		want := events.StopTaskCompleted
		if verdict.InDoubt != nil && verdict.InDoubt.ReplayPolicy == events.ReplayNever {
			want = events.StopResumeStateUnknown
		}
		if r.StopReason != want {
			t.Fatalf("crash %d at %s: %s, want %s", crash, verdict.State, r.StopReason, want)
		}
		d, _ := db.load()
		seen := map[string]bool{}
		for _, f := range d.Findings {
			key := fmt.Sprint(f.Document, f.Clause)
			if seen[key] {
				t.Fatalf("crash %d: finding %s written twice", crash, key)
			}
			seen[key] = true
		}
		t.Logf("crash after %d writes (%s): %s, %d findings", crash, verdict.State, r.StopReason, len(d.Findings))
	}
}

// TestReviewAgainstAnEndpoint: with -url both phases talk to an
// OpenAI-compatible server (a local test server replaying the scripts).
func TestReviewAgainstAnEndpoint(t *testing.T) {
	var calls atomic.Int32
	replies := append(append([]string{}, phases[0].script...), phases[1].script...)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		i := int(calls.Add(1)) - 1
		if i >= len(replies) {
			http.Error(w, `{"error":{"message":"script exhausted"}}`, 400)
			return
		}
		b, _ := json.Marshal(replies[i])
		fmt.Fprintf(w, `{"id":"cmpl-%d","choices":[{"message":{"content":%s}}]}`, i, b)
	}))
	defer srv.Close()
	c := cfg(t)
	c.url, c.model = srv.URL+"/v1", "m"
	var out strings.Builder
	if err := review(context.Background(), c, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if calls.Load() != int32(len(replies)) {
		t.Fatalf("%d calls, want %d", calls.Load(), len(replies))
	}
}

// TestTwoReviewsKeepTheirOwnFindings: reviews alpha and beta share a store
// and a results file; each reports only its own findings.
func TestTwoReviewsKeepTheirOwnFindings(t *testing.T) {
	c := cfg(t)
	defer func(p string) { runPrefix = p }(runPrefix)
	for _, name := range []string{"alpha", "beta"} {
		runPrefix = name
		var out strings.Builder
		if err := review(context.Background(), c, &out); err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(out.String(), "finding:"); n != 2 {
			t.Fatalf("review %s reported %d findings:\n%s", name, n, out.String())
		}
	}
}

// TestResumingAnUnknownReviewIsAnError: -resume on a review never started
// says so instead of starting a fresh one; starting a review twice points
// at -resume.
func TestResumingAnUnknownReviewIsAnError(t *testing.T) {
	c := cfg(t)
	defer func(p string) { runPrefix = p }(runPrefix)
	runPrefix = "nosuch"
	c.resume = true
	var out strings.Builder
	err := review(context.Background(), c, &out)
	if !errors.Is(err, engine.ErrRunNotFound) || !strings.Contains(err.Error(), "start it without -resume") {
		t.Fatalf("resume of an unknown review: %v", err)
	}
	if runs, _ := openRuns(t, c.store); runs != 0 {
		t.Fatalf("a fresh review was started: %d runs", runs)
	}
	c.resume = false
	if err := review(context.Background(), c, &out); err != nil {
		t.Fatal(err)
	}
	if err := review(context.Background(), c, &out); !errors.Is(err, engine.ErrRunExists) || !strings.Contains(err.Error(), "-resume") {
		t.Fatalf("second start: %v", err)
	}
}

func openRuns(t *testing.T, path string) (int, error) {
	s, err := kv.Open(path, kv.Options{ReadOnly: true})
	if err != nil {
		return 0, err
	}
	defer s.Close()
	runs, err := s.Runs(context.Background())
	return len(runs), err
}

// forkedLog is run's log in the store file path: its RunStarted's fork
// origin and its steps.
func forkedLog(t *testing.T, path, run string) (*events.ForkOrigin, []events.StepRecord) {
	t.Helper()
	s, err := kv.Open(path, kv.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	stream, err := s.Load(context.Background(), run)
	if err != nil || len(stream) == 0 {
		t.Fatalf("run %s: %d events, %v", run, len(stream), err)
	}
	return stream[0].Event.(events.RunStarted).Fork, projections.Fold(stream).Trajectory()
}

// TestAForkedPhaseGoesOnFromTheSourcesStep: review-1 runs; forked at a
// step, a phase's run names its source and step, holds the source's
// steps below it as they are, and completes; a forked triage is followed
// by the fork's own review phase, a forked review phase reads
// review-1's triage (its prompt is the source's) and reports only the
// findings it made itself.
func TestAForkedPhaseGoesOnFromTheSourcesStep(t *testing.T) {
	c := cfg(t)
	defer func(p string) { runPrefix = p }(runPrefix)
	if err := review(context.Background(), c, new(strings.Builder)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		prefix, from string
		at           int
		want         []string // lines of the output
		findings     int
	}{
		{prefix: "tri", from: "review-1/triage", at: 2, findings: 2, want: []string{
			"tri/triage forked from review-1/triage at step 2", "phase triage: task_completed after 5 steps",
			"phase review: task_completed after 6 steps", "summary: 2 high-severity issues in 2 documents"}},
		{prefix: "rev", from: "review-1/review", at: 2, findings: 1, want: []string{
			"rev/review forked from review-1/review at step 2", "phase review: task_completed after 6 steps",
			"finding: nda-acme clause 2 [high] no liability cap"}},
	} {
		runPrefix = tc.prefix
		fork := c
		fork.forkFrom, fork.at = tc.from, tc.at
		var out strings.Builder
		if err := review(context.Background(), fork, &out); err != nil {
			t.Fatalf("fork of %s: %v\n%s", tc.from, err, out.String())
		}
		for _, line := range tc.want {
			if !strings.Contains(out.String(), line) {
				t.Errorf("fork of %s printed no %q:\n%s", tc.from, line, out.String())
			}
		}
		if n := strings.Count(out.String(), "finding:"); n != tc.findings {
			t.Errorf("fork of %s reported %d findings, want %d:\n%s", tc.from, n, tc.findings, out.String())
		}
		phase := tc.prefix + tc.from[strings.Index(tc.from, "/"):]
		origin, steps := forkedLog(t, c.store, phase)
		_, source := forkedLog(t, c.store, tc.from)
		if origin == nil || origin.Run != tc.from || origin.Step != tc.at || len(origin.Differences) != 0 {
			t.Errorf("%s's RunStarted.Fork is %+v, want %s at step %d, no differences", phase, origin, tc.from, tc.at)
		}
		if !reflect.DeepEqual(steps[:tc.at], source[:tc.at]) {
			t.Errorf("%s's first steps\n%+v\ndiffer from its source's\n%+v", phase, steps[:tc.at], source[:tc.at])
		}
		// Fed the source's replies, with the source's goal, the fork
		// retraces it after tc.at too (but for the clock).
		for i := range steps {
			steps[i].StepWallMs, source[i].StepWallMs = 0, 0
		}
		if !reflect.DeepEqual(steps, source) {
			t.Errorf("%s's steps\n%+v\ndiffer from its source's\n%+v", phase, steps, source)
		}
	}
}

// TestAForkIsRefusedWritingNothing: a step beyond the source's end, a
// taken run, an unknown source, a run that is no phase's, and the flags a
// fork does not go with are refused, and no run is written.
func TestAForkIsRefusedWritingNothing(t *testing.T) {
	c := cfg(t)
	defer func(p string) { runPrefix = p }(runPrefix)
	if err := review(context.Background(), c, new(strings.Builder)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		prefix, from string
		at, crash    int
		resume       bool
		want         string
		is           error
	}{
		{prefix: "x", from: "review-1/triage", at: 6, want: `run "review-1/triage" has no step 6 to fork at`, is: engine.ErrForkStep},
		{prefix: "review-1", from: "review-1/triage", at: 1, want: `run "review-1/triage" exists in`},
		{prefix: "x", from: "nosuch/review", at: 0, want: `no run "nosuch/review" to fork in`, is: engine.ErrRunNotFound},
		{prefix: "x", from: "review-1", at: 0, want: `-fork-from "review-1": want a phase's run, PREFIX/triage or PREFIX/review (phase "review-1")`},
		{prefix: "x", from: "review-1/triage", at: 1, resume: true, want: "-fork-from starts a new run and -resume continues one"},
		{prefix: "x", from: "review-1/triage", at: 1, crash: 2, want: "-fork-from with -crash-after: the crashing store does not fork runs"},
		{prefix: "x", at: 1, want: "-at 1: a step to fork at needs -fork-from PREFIX/PHASE"},
	} {
		runPrefix = tc.prefix
		bad := c
		bad.forkFrom, bad.at, bad.resume = tc.from, tc.at, tc.resume
		if tc.crash > 0 {
			bad.crashAfter = tc.crash
		}
		err := review(context.Background(), bad, new(strings.Builder))
		if err == nil || !strings.Contains(err.Error(), tc.want) || (tc.is != nil && !errors.Is(err, tc.is)) {
			t.Errorf("-run %s -fork-from %s -at %d: %v, want %q", tc.prefix, tc.from, tc.at, err, tc.want)
		}
	}
	if runs, err := openRuns(t, c.store); err != nil || runs != 2 {
		t.Fatalf("%d runs after the refusals (%v), want review-1's two", runs, err)
	}
}
