package main

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
	"github.com/polyloop/polyloop/stores"
)

// agentStream is a sound stream of a run started for agent, cut after n
// events.
func agentStream(runID, agent string, n int) []events.Event {
	stream := proptest.SoundStream(runID)[:n]
	started := stream[0].(events.RunStarted)
	started.Agent = agent
	stream[0] = started
	return stream
}

// queueFixture writes the runs the cancel and resume tests act on:
// "idle" (nobody drives it, between steps), "doubt" (nobody drives it, an
// action's outcome unknown), "done" (finished), "queued" (an agent's run,
// given back by a worker after a failure, claimable only in an hour) and
// "fresh" (an agent's run never claimed).
func queueFixture(t *testing.T, s seams.RunStore) {
	t.Helper()
	proptest.AppendEach(t, s, "idle", proptest.SoundStream("idle")[:5])
	proptest.AppendEach(t, s, "doubt", proptest.SoundStream("doubt")[:4])
	proptest.AppendEach(t, s, "done", proptest.SoundStream("done"))
	proptest.AppendEach(t, s, "queued", agentStream("queued", "reviewer", 5))
	proptest.AppendEach(t, s, "fresh", agentStream("fresh", "reviewer", 1))
	q := s.(seams.RunQueue)
	claims, err := q.ClaimRuns(context.Background(), []string{"reviewer"}, 10)
	if err != nil || len(claims) != 2 {
		t.Fatalf("claim: %v, %v", claims, err)
	}
	for _, c := range claims {
		failure := ""
		if c.RunID == "queued" {
			failure = "model: 503 upstream"
		}
		if err := q.ReleaseRun(context.Background(), c.RunID, failure, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
}

// describe is the store's entry for runID.
func describe(t *testing.T, s seams.RunStore, runID string) seams.RunInfo {
	t.Helper()
	info, err := s.(seams.RunDescriber).Describe(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// stopReason is the stop reason of runID's RunFinished, "" without one.
func stopReason(t *testing.T, s seams.RunStore, runID string) events.StopReason {
	t.Helper()
	stream, err := s.Load(context.Background(), runID)
	if err != nil || len(stream) == 0 {
		t.Fatalf("load %s: %d events, %v", runID, len(stream), err)
	}
	if f, ok := stream[len(stream)-1].Event.(events.RunFinished); ok {
		return f.Result.StopReason
	}
	return ""
}

// TestCancelSaysWhatBecameOfEachRun: one row per outcome of cancel: a
// run a driver holds gets a request its driver carries out (the holder
// named); a run nobody holds is ended here, cancelled, a side effect in
// doubt named; a finished run and a run not in the store are refused
// (exit 1), the other runs cancelled still.
func TestCancelSaysWhatBecameOfEachRun(t *testing.T) {
	ctx := context.Background()
	s := &seamstest.MemStore{}
	queueFixture(t, s)
	release, err := s.LockRun("fresh") // a worker drives it
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	var out, errOut strings.Builder
	code := cancelRuns(ctx, s, "STORE", "ops@admin", []string{"fresh", "idle", "doubt", "done", "ghost"}, &out, &errOut)
	wantOut := "fresh: cancel requested; memstore drives it and ends it before its next side effect\n" +
		"idle: cancelled (nobody drove it)\n" +
		"doubt: cancelled (nobody drove it)\n" +
		"  a side effect stays in doubt: step 0, action, tool list, result id r0a, replay policy never (it may or may not have happened; cancelling settles nothing about it)\n"
	wantErr := "polyloop-admin: cancel: run \"done\" has finished; nothing to cancel\n" +
		"polyloop-admin: cancel: no run \"ghost\" in STORE\n"
	if code != exitProblem || out.String() != wantOut || errOut.String() != wantErr {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s\nwant stdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String(), wantOut, wantErr)
	}
	for id, want := range map[string]events.StopReason{"idle": events.StopCancelled, "doubt": events.StopCancelled, "fresh": "", "done": events.StopAgentFinished} {
		if got := stopReason(t, s, id); got != want {
			t.Errorf("run %s: stop reason %q, want %q", id, got, want)
		}
	}
	if r, err := s.CancelRequested(ctx, "fresh"); err != nil || r == nil || r.By != "ops@admin" {
		t.Errorf("the request for the held run: %+v, %v", r, err)
	}
}

// TestResumeSaysWhatBecameOfEachRun: one row per outcome of resume: an
// agent's run nobody drives is handed back to the workers at once, its
// failures, last error and retry time cleared; a run a driver holds, a
// run started without an agent, a finished run and a run not in the store
// are refused, each saying why (exit 1).
func TestResumeSaysWhatBecameOfEachRun(t *testing.T) {
	ctx := context.Background()
	s := &seamstest.MemStore{}
	queueFixture(t, s)
	if info := describe(t, s, "queued"); info.Failures != 1 || info.RetryAt.IsZero() {
		t.Fatalf("before: %+v", info)
	}
	release, err := s.LockRun("fresh")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	var out, errOut strings.Builder
	code := resumeRuns(ctx, s, "STORE", []string{"queued", "fresh", "idle", "done", "ghost"}, &out, &errOut)
	wantOut := "queued: handed back to the workers of agent reviewer\n"
	wantErr := `polyloop-admin: resume: run "fresh" is driven already (held by memstore)` + "\n" +
		`polyloop-admin: resume: run "idle" was not started for an agent, so no worker claims it; resume it with engine.Resume in the program that runs it` + "\n" +
		`polyloop-admin: resume: run "done" has finished; nothing to resume` + "\n" +
		`polyloop-admin: resume: no run "ghost" in STORE` + "\n"
	if code != exitProblem || out.String() != wantOut || errOut.String() != wantErr {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s\nwant stdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String(), wantOut, wantErr)
	}
	if info := describe(t, s, "queued"); info.Failures != 0 || info.LastError != "" || !info.RetryAt.IsZero() || info.Status != seams.StatusAwaiting {
		t.Fatalf("after resume: %+v", info)
	}
	if claims, err := s.ClaimRuns(ctx, []string{"reviewer"}, 10); err != nil || len(claims) != 1 || claims[0].RunID != "queued" {
		t.Fatalf("a worker claims %v (%v), want the resumed run", claims, err)
	}
}

// TestAStoreWithoutAQueueIsSaid: cancel and resume on a store that keeps
// no cancel requests or queue say so, naming the store, and change
// nothing.
func TestAStoreWithoutAQueueIsSaid(t *testing.T) {
	mem := &seamstest.MemStore{}
	queueFixture(t, mem)
	plain := struct{ seams.RunStore }{mem}
	before := mem.Transactions()
	var out, errOut strings.Builder
	if code := cancelRuns(context.Background(), plain, "STORE", "ops", []string{"idle"}, &out, &errOut); code != exitProblem ||
		!strings.Contains(errOut.String(), "STORE keeps no cancel requests") || out.Len() != 0 {
		t.Errorf("cancel: exit %d, %s%s", code, out.String(), errOut.String())
	}
	errOut.Reset()
	if code := resumeRuns(context.Background(), plain, "STORE", []string{"queued"}, &out, &errOut); code != exitProblem ||
		!strings.Contains(errOut.String(), "STORE keeps no queue of runs for workers") || out.Len() != 0 {
		t.Errorf("resume: exit %d, %s%s", code, out.String(), errOut.String())
	}
	if mem.Transactions() != before {
		t.Error("the store was written")
	}
}

// TestTheOperatorIsUserAtHost: cancel's default --by.
func TestTheOperatorIsUserAtHost(t *testing.T) {
	if by := operator(); !regexp.MustCompile(`^[^@\s]+@[^@\s]+$`).MatchString(by) {
		t.Fatalf("operator() = %q, want user@host", by)
	}
}

// needsQueue fails t, saying so, when s lacks the interfaces cancel and
// resume use: kv.Store and pgstore.Store gain them with the worker pool's
// store changes.
func needsQueue(t *testing.T, s any) {
	t.Helper()
	name := fmt.Sprintf("%T", s)
	switch name {
	case "*kv.Store":
		name = "kv.Store"
	case "*pgstore.Store":
		name = "pgstore.Store"
	}
	for _, c := range []struct {
		iface string
		ok    bool
	}{
		{"seams.RunCanceller", func() bool { _, ok := s.(seams.RunCanceller); return ok }()},
		{"seams.RunQueue", func() bool { _, ok := s.(seams.RunQueue); return ok }()},
		{"seams.RunDescriber", func() bool { _, ok := s.(seams.RunDescriber); return ok }()},
	} {
		if !c.ok {
			t.Fatalf("%s does not implement %s yet (polyloop-admin cancel and resume act through it; the store's change for the worker pool adds it)", name, c.iface)
		}
	}
}

// TestCancelAndResumeOnAFile: cancel and resume through the command on a
// bbolt file: the store opener, the default --by, the outcomes and the
// exit statuses.
func TestCancelAndResumeOnAFile(t *testing.T) {
	needsQueue(t, (*kv.Store)(nil))
	path := filepath.Join(t.TempDir(), "s.db")
	s, err := kv.Open(path, kv.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	queueFixture(t, s)
	s.Close()

	if code, out := admin("cancel", path, "idle", "doubt"); code != exitOK || !strings.Contains(out, "idle: cancelled (nobody drove it)") ||
		!strings.Contains(out, "doubt: cancelled (nobody drove it)\n  a side effect stays in doubt: step 0, action, tool list") {
		t.Fatalf("cancel: %d\n%s", code, out)
	}
	if code, out := admin("cancel", "--by", "ops", path, "done", "ghost"); code != exitProblem || !strings.Contains(out, `run "done" has finished`) ||
		!strings.Contains(out, `no run "ghost" in `+stores.Describe(path)) {
		t.Fatalf("cancel of a finished and an unknown run: %d\n%s", code, out)
	}
	if code, out := admin("resume", path, "queued"); code != exitOK || out != "queued: handed back to the workers of agent reviewer\n" {
		t.Fatalf("resume: %d\n%s", code, out)
	}
	if code, out := admin("resume", path, "idle", "done", "ghost"); code != exitProblem || !strings.Contains(out, `run "idle" has finished`) ||
		!strings.Contains(out, `run "done" has finished`) || !strings.Contains(out, `no run "ghost"`) {
		t.Fatalf("resume of cancelled, finished and unknown runs: %d\n%s", code, out)
	}
	s, err = kv.Open(path, kv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for id, want := range map[string]events.StopReason{"idle": events.StopCancelled, "doubt": events.StopCancelled, "queued": "", "done": events.StopAgentFinished} {
		if got := stopReason(t, s, id); got != want {
			t.Errorf("run %s: stop reason %q, want %q", id, got, want)
		}
	}
	if info := describe(t, s, "queued"); info.Failures != 0 || !info.RetryAt.IsZero() || info.Status != seams.StatusAwaiting {
		t.Errorf("the resumed run: %+v", info)
	}
	for _, args := range [][]string{{"cancel", path}, {"resume", "--by", "x", path, "idle"}, {"cancel", "--force", path, "idle"}} {
		if code, out := admin(args...); code != exitUsage {
			t.Errorf("%v: %d\n%s", args, code, out)
		}
	}
}

// TestCancelOnPostgresReachesTheDriver: a run a worker drives in another
// store (another process, as far as the command can tell) is cancelled by
// a request its driver carries out: cancel names the holder, the run ends
// cancelled before its next side effect, and resume hands a run of an
// agent back to the workers.
func TestCancelOnPostgresReachesTheDriver(t *testing.T) {
	needsQueue(t, (*pgstore.Store)(nil))
	url := pgtest.StoreURL(t)
	worker, err := pgstore.Open(context.Background(), url, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer worker.Close()
	model := seamstest.NewPausingModel(&seamstest.Model{Turns: seamstest.Replies(`ACTION: ls`, `ACTION: ls`, `FINAL: done`)}, 2)
	executor := &seamstest.Executor{}
	done := make(chan error, 1)
	go func() {
		res, err := engine.Run(context.Background(), engine.Definition{Model: model, Parser: seamstest.Parser{}, Store: worker},
			engine.Request{RunID: "driven", Executor: executor, ModelReplayPolicy: events.ReplaySafe,
				Budget: engine.Budget{MaxSteps: 5, MaxActions: 5, MaxConsecutiveParseFailures: 2, MaxPromptChars: 10_000}})
		if err == nil && res.StopReason != events.StopCancelled {
			err = fmt.Errorf("the run stopped with %s, not cancelled", res.StopReason)
		}
		done <- err
	}()
	<-model.Entered // step 0 done; the run waits in its second model call
	code, out := admin("cancel", "--by", "ops", url, "driven")
	if code != exitOK || out != "driven: cancel requested; "+worker.Owner()+" drives it and ends it before its next side effect\n" {
		t.Fatalf("cancel: %d\n%s", code, out)
	}
	close(model.Release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := len(executor.Calls()); n != 1 {
		t.Fatalf("%d actions executed, want the first alone", n)
	}
	fill(t, worker, 0)
	proptest.AppendEach(t, worker, "queued", agentStream("queued", "reviewer", 5))
	if code, out := admin("resume", url, "queued", "u"); code != exitProblem || !strings.Contains(out, "queued: handed back to the workers of agent reviewer\n") ||
		!strings.Contains(out, `run "u" was not started for an agent`) {
		t.Fatalf("resume: %d\n%s", code, out)
	}
}
