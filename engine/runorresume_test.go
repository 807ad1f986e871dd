package engine_test

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// startedMeanwhile is a store on which another driver starts the run
// between RunOrResume's look for it (HasRun, which says it is not there)
// and its start.
type startedMeanwhile struct {
	seams.RunStore
	start func()
}

func (s *startedMeanwhile) HasRun(ctx context.Context, runID string) (bool, error) {
	if s.start != nil {
		start := s.start
		s.start = nil
		start()
		return false, nil
	}
	stream, err := s.Load(ctx, runID)
	return len(stream) > 0, err
}

// TestRunOrResumeContinuesOrStartsARun: RunOrResume starts a run with no
// log, continues an unfinished one, returns a finished one's result
// writing nothing, and fails as Resume does — every distinct error
// unchanged — on a run it may not continue.
func TestRunOrResumeContinuesOrStartsARun(t *testing.T) {
	cases := []struct {
		name string
		// setup prepares the store for a (its turns: "ACTION: ls", "FINAL: 3").
		setup func(t *testing.T, store *kv.Store, a *agent)
		// want is the stop reason of a run RunOrResume drives or returns;
		// wantErr the error it fails with instead.
		want    events.StopReason
		wantErr error
		// writes: whether the call may write.
		writes bool
		calls  int // model calls RunOrResume makes
	}{
		{"no log: the run is started", func(*testing.T, *kv.Store, *agent) {}, events.StopAgentFinished, nil, true, 2},
		{"unfinished: the run is continued", func(t *testing.T, _ *kv.Store, a *agent) {
			if _, err := engine.Start(context.Background(), a.def, a.req); err != nil {
				t.Fatal(err)
			}
		}, events.StopAgentFinished, nil, true, 2},
		{"crashed mid-step: the run is continued", func(t *testing.T, store *kv.Store, a *agent) {
			crashing := *a
			crashing.def.Store = &proptest.CrashingStore{Inner: store, After: 1} // the model call's intent durable, its reply not
			if _, err := engine.Run(context.Background(), crashing.def, crashing.req); !errors.Is(err, proptest.ErrCrashed) {
				t.Fatal(err)
			}
		}, events.StopAgentFinished, nil, true, 2},
		{"finished: its recorded result, nothing written", func(t *testing.T, _ *kv.Store, a *agent) {
			a.run(t)
		}, events.StopAgentFinished, nil, false, 0},
		{"started by another driver after the look: continued", func(t *testing.T, store *kv.Store, a *agent) {
			other := *a
			a.def.Store = &startedMeanwhile{RunStore: store, start: func() {
				if _, err := engine.Start(context.Background(), other.def, other.req); err != nil {
					t.Error(err)
				}
			}}
		}, events.StopAgentFinished, nil, true, 2},
		{"invalid request", func(_ *testing.T, _ *kv.Store, a *agent) { a.req.Budget.MaxSteps = -1 },
			"", engine.ErrInvalidRequest, false, 0},
		{"parameters changed", func(t *testing.T, _ *kv.Store, a *agent) {
			if _, err := engine.Start(context.Background(), a.def, a.req); err != nil {
				t.Fatal(err)
			}
			a.req.Budget.MaxSteps = 99
		}, "", engine.ErrParametersChanged, false, 0},
		{"another driver holds it", func(t *testing.T, store *kv.Store, a *agent) {
			if _, err := engine.Start(context.Background(), a.def, a.req); err != nil {
				t.Fatal(err)
			}
			release, err := store.LockRun(a.req.RunID)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(release)
		}, "", engine.ErrRunBusy, false, 0},
		{"another driver holds it as it starts it", func(t *testing.T, store *kv.Store, a *agent) {
			release, err := store.LockRun(a.req.RunID)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(release)
		}, "", engine.ErrRunBusy, false, 0},
		{"awaiting a decision", func(t *testing.T, _ *kv.Store, a *agent) {
			a.req.Tools = approvalTools(t)
			a.model.Turns = seamstest.Replies(`TOOL refund {"amount": 20}`)
			awaiting(t, a)
		}, "", engine.ErrAwaitingDecision, false, 0},
		{"corrupt", func(t *testing.T, store *kv.Store, a *agent) {
			failure := "x"
			if _, err := store.Append(context.Background(), a.req.RunID, ulid.ULID{}, proptest.SoundStream(a.req.RunID)[0],
				events.ModelCallResult{RunID: a.req.RunID, ResultID: "orphan", Failure: &failure}); err != nil {
				t.Fatal(err)
			}
		}, "", recovery.ErrCorrupt, false, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			store := openKV(t)
			a := newAgent(store, "r", seamstest.Replies("ACTION: ls", "FINAL: 3")...)
			c.setup(t, store, a)
			var want events.RunResult
			if c.want != "" && !c.writes {
				var err error
				if want, err = engine.Resume(context.Background(), a.def, a.req); err != nil {
					t.Fatal(err)
				}
			}
			calls, before := len(a.model.Calls()), store.Transactions()
			got, err := engine.RunOrResume(context.Background(), a.def, a.req)
			switch {
			case c.wantErr != nil:
				if !errors.Is(err, c.wantErr) {
					t.Fatalf("got %v, want %v", err, c.wantErr)
				}
			case err != nil:
				t.Fatalf("got %v, want the run %s", err, c.want)
			case got.StopReason != c.want:
				t.Fatalf("stopped %s, want %s", got.StopReason, c.want)
			case !c.writes && !reflect.DeepEqual(got, want):
				t.Fatalf("a finished run's result %+v, want the recorded %+v", got, want)
			}
			if n := len(a.model.Calls()) - calls; n != c.calls {
				t.Errorf("RunOrResume made %d model calls, want %d", n, c.calls)
			}
			if !c.writes && store.Transactions() != before {
				t.Errorf("RunOrResume wrote %d transactions, want none", store.Transactions()-before)
			}
			if c.wantErr == nil {
				if r, ok := recoveryResult(t, store, a.req.RunID); !ok || r.StopReason != c.want {
					t.Errorf("the stored run: %+v, want it finished %s", r, c.want)
				}
			}
		})
	}
}

// recoveryResult is the result a store holds for a run, if it finished.
func recoveryResult(t *testing.T, store seams.RunStore, runID string) (events.RunResult, bool) {
	t.Helper()
	v, err := recovery.Classify(runID, soundLog(t, store, runID))
	if err != nil || v.Result == nil {
		return events.RunResult{}, false
	}
	return *v.Result, true
}
