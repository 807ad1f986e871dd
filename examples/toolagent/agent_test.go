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
	"strings"
	"sync/atomic"
	"testing"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
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
