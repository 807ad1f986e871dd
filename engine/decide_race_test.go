package engine_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/internal/soak"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/projections"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// raceStores are the stores a decision race runs on, with how many
// trials: each gives two handles on one store — the same one where the
// store serves one process (MemStore, kv), two processes' where it serves
// many (PostgreSQL: two pgstore.Stores, whose leases live in the
// database).
func raceStores(t *testing.T) []struct {
	name   string
	trials int
	open   func(t *testing.T) (a, b seams.RunStore)
} {
	return []struct {
		name   string
		trials int
		open   func(t *testing.T) (a, b seams.RunStore)
	}{
		{"memory", soak.Count(40, 200), func(*testing.T) (seams.RunStore, seams.RunStore) {
			s := &seamstest.MemStore{}
			return s, s
		}},
		{"kv", soak.Count(40, 200), func(t *testing.T) (seams.RunStore, seams.RunStore) {
			// Without fsync: the race is in the append rules, not the disk.
			s, err := kv.Open(filepath.Join(t.TempDir(), "runs.db"), kv.Options{NoSync: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s, s
		}},
		{"postgres", soak.Count(10, 50), func(t *testing.T) (seams.RunStore, seams.RunStore) {
			dsn, schema := pgtest.DSN(t), pgtest.Schema(t)
			var out [2]seams.RunStore
			for i := range out {
				s, err := pgstore.Open(context.Background(), dsn, pgstore.Options{Schema: schema, MaxConns: 4})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				out[i] = s
			}
			return out[0], out[1]
		}},
	}
}

// decisionsOf is the run's Decision events on call.
func decisionsOf(t *testing.T, store seams.RunStore, runID, call string) []events.Envelope {
	t.Helper()
	stream, err := store.Load(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	if err := recovery.Check(runID, stream); err != nil {
		t.Fatalf("run %s: %v", runID, err)
	}
	var out []events.Envelope
	for _, env := range stream {
		if d, ok := env.Event.(events.Decision); ok && d.ResultID == call {
			out = append(out, env)
		}
	}
	return out
}

// race runs f and g at once.
func race(f, g func()) {
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for _, h := range []func(){f, g} {
		wg.Go(func() {
			<-gate
			h()
		})
	}
	close(gate)
	wg.Wait()
}

// TestTwoDecisionsOnOneCallRecordOne: two people decide on one pending
// call at once (approve or reject, each drawn), through the same store or
// two processes' handles on it. Exactly one decision is recorded — the
// one whose Decide returned it — and the other gets ErrAlreadyDecided, or
// ErrRunBusy when it gave up waiting for the run (never because the
// run's tail moved under it: the run is taken while deciding, so the two
// take turns); the run then goes on as
// the recorded decision says: the action runs once if approved, never if
// rejected.
func TestTwoDecisionsOnOneCallRecordOne(t *testing.T) {
	for _, st := range raceStores(t) {
		t.Run(st.name, func(t *testing.T) {
			storeA, storeB := st.open(t)
			ctx := context.Background()
			already, busy := 0, 0
			for trial := range st.trials {
				runID := fmt.Sprintf("two-%d", trial)
				a := approvalAgent(t, storeA, runID, `TOOL refund {"amount":40}`, "FINAL: done")
				pending := awaiting(t, a)
				verdicts := [2]events.Verdict{events.VerdictApproved, events.VerdictRejected}
				if trial%3 == 0 {
					verdicts[1] = events.VerdictApproved
				}
				stores := [2]seams.RunStore{storeA, storeB}
				var envs [2]events.Envelope
				var errs [2]error
				decide := func(i int) func() {
					return func() {
						envs[i], errs[i] = engine.Decide(ctx, stores[i], events.Decision{RunID: runID, ResultID: pending.Call,
							Verdict: verdicts[i], By: fmt.Sprintf("person-%d", i)})
					}
				}
				race(decide(0), decide(1))
				winner := -1
				for i, err := range errs {
					switch {
					case err == nil && winner < 0:
						winner = i
					case err == nil:
						t.Fatalf("trial %d: both decisions were accepted", trial)
					case errors.Is(err, engine.ErrAlreadyDecided):
						already++
					case errors.Is(err, engine.ErrRunBusy) && errors.Is(err, seams.ErrRunLocked):
						busy++ // it waited for the run past decideWait
					default:
						t.Fatalf("trial %d: decision %d: %v", trial, i, err)
					}
				}
				if winner < 0 {
					t.Fatalf("trial %d: no decision was accepted: %v", trial, errs)
				}
				recorded := decisionsOf(t, storeA, runID, pending.Call)
				if len(recorded) != 1 || recorded[0].ID != envs[winner].ID || recorded[0].Event.(events.Decision).By != fmt.Sprintf("person-%d", winner) {
					t.Fatalf("trial %d: %d decisions recorded, want the one person-%d made", trial, len(recorded), winner)
				}
				r, err := engine.Resume(ctx, a.def, a.req)
				if err != nil || r.StopReason != events.StopAgentFinished {
					t.Fatalf("trial %d: resume: %v %v", trial, r.StopReason, err)
				}
				want := 0
				if verdicts[winner] == events.VerdictApproved {
					want = 1
				}
				if n := a.exec.Executions(pending.Call); n != want {
					t.Fatalf("trial %d: %s, and the action ran %d times", trial, verdicts[winner], n)
				}
			}
			t.Logf("%d races: the loser got ErrAlreadyDecided %d times, ErrRunBusy %d times", st.trials, already, busy)
			if already == 0 {
				t.Errorf("no loser ever saw the winner's decision")
			}
		})
	}
}

// TestADecisionRacingAResumeRunsTheActionOnce: an approval races a Resume
// of the awaiting run (on PostgreSQL from two processes). The Resume
// either read the log before the decision (it returns the run awaiting,
// nothing executed), after it (it executes the action and finishes), or
// found the run held (ErrRunBusy); the approval is recorded (or, having
// waited too long for the run, refused with ErrRunBusy and made again).
// Afterwards, resumed to its end, the run's log is sound and the action
// ran exactly once.
func TestADecisionRacingAResumeRunsTheActionOnce(t *testing.T) {
	for _, st := range raceStores(t) {
		t.Run(st.name, func(t *testing.T) {
			storeA, storeB := st.open(t)
			ctx := context.Background()
			outcomes := map[string]int{}
			for trial := range st.trials {
				runID := fmt.Sprintf("resume-%d", trial)
				a := approvalAgent(t, storeA, runID, `TOOL refund {"amount":40}`, "FINAL: done")
				pending := awaiting(t, a)
				b := *a
				b.def.Store = storeB
				approval := events.Decision{RunID: runID, ResultID: pending.Call, Verdict: events.VerdictApproved, By: "ana"}
				var decideErr, resumeErr error
				var result events.RunResult
				race(func() { _, decideErr = engine.Decide(ctx, storeA, approval) },
					func() { result, resumeErr = engine.Resume(ctx, b.def, b.req) })
				ran := a.exec.Executions(pending.Call)
				switch {
				case resumeErr == nil:
					if result.StopReason != events.StopAgentFinished || ran != 1 || decideErr != nil {
						t.Fatalf("trial %d: the resume finished %s with the action run %d times; the decision: %v", trial, result.StopReason, ran, decideErr)
					}
					outcomes["resume read the decision and ran the action"]++
				case errors.Is(resumeErr, engine.ErrAwaitingDecision):
					outcomes["resume read the log before the decision"]++
				case errors.Is(resumeErr, engine.ErrRunBusy):
					outcomes["resume found the run held"]++
				default:
					t.Fatalf("trial %d: resume: %v", trial, resumeErr)
				}
				if resumeErr != nil && ran != 0 {
					t.Fatalf("trial %d: the resume failed (%v) yet the action ran %d times", trial, resumeErr, ran)
				}
				switch {
				case decideErr == nil:
				case errors.Is(decideErr, engine.ErrRunBusy):
					outcomes["the decision gave up waiting and was made again"]++
					if _, err := engine.Decide(ctx, storeA, approval); err != nil {
						t.Fatalf("trial %d: the decision again: %v", trial, err)
					}
				default:
					t.Fatalf("trial %d: decide: %v", trial, decideErr)
				}
				if resumeErr != nil {
					if r, err := engine.Resume(ctx, a.def, a.req); err != nil || r.StopReason != events.StopAgentFinished {
						t.Fatalf("trial %d: the last resume: %v %v", trial, r.StopReason, err)
					}
				}
				if n := a.exec.Executions(pending.Call); n != 1 {
					t.Fatalf("trial %d: the approved action ran %d times", trial, n)
				}
				if got := decisionsOf(t, storeA, runID, pending.Call); len(got) != 1 {
					t.Fatalf("trial %d: %d decisions recorded", trial, len(got))
				}
				stream, _ := storeA.Load(ctx, runID)
				if l := projections.Fold(stream); l.Finished == nil || len(l.Decisions) != 1 {
					t.Fatalf("trial %d: finished=%t, %d decisions", trial, l.Finished != nil, len(l.Decisions))
				}
			}
			t.Logf("%d races: %v", st.trials, outcomes)
		})
	}
}
