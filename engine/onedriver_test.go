package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/projections"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// crashedAtReply leaves run "r" on store with its first reply stored and no
// action intent yet: the next driver re-parses the reply and executes the
// never action it asks for.
func crashedAtReply(t *testing.T, a *agent) {
	t.Helper()
	a.req.OneEventPerTransaction = true
	crashing := *a
	crashing.def.Store = &proptest.CrashingStore{Inner: a.def.Store, After: 3} // run_started, intent, reply
	if _, err := engine.Run(context.Background(), crashing.def, crashing.req); !errors.Is(err, proptest.ErrCrashed) {
		t.Fatalf("crashing run: %v", err)
	}
}

// TestTwoDriversOnOneRunExecuteANeverActionOnce: two Resume calls race on
// one crashed run sharing one store (and, separately, Run races Resume on a
// new run). Exactly one continues; the other returns ErrRunBusy, or, when
// it came after the run finished, the recorded result; the never action
// runs once and the log stays sound.
func TestTwoDriversOnOneRunExecuteANeverActionOnce(t *testing.T) {
	const trials = 50
	for _, store := range []string{"kv", "memory"} {
		t.Run("ResumeAndResume/"+store, func(t *testing.T) {
			var tl raceTally
			for range trials {
				a := newAgent(storeOf(t, store), "r", seamstest.Replies("ACTION: pay the invoice", "FINAL: paid")...)
				crashedAtReply(t, a)
				tl.add(a, raceDrivers(a, engine.Resume, engine.Resume)...)
			}
			tl.check(t, trials)
			t.Logf("%d of %d second drivers refused with ErrRunBusy, the others found the run finished", tl.busy, trials)
		})
		t.Run("RunAndResume/"+store, func(t *testing.T) {
			var tl raceTally
			for range trials {
				a := newAgent(storeOf(t, store), "r", seamstest.Replies("ACTION: pay the invoice", "FINAL: paid")...)
				started := make(chan struct{})
				a.def.Events = &signalSink{on: events.KindRunStarted, ch: started}
				var wg sync.WaitGroup
				var runErr, resumeErr error
				wg.Add(2)
				go func() { defer wg.Done(); _, runErr = engine.Run(context.Background(), a.def, a.req) }()
				go func() {
					defer wg.Done()
					<-started
					_, resumeErr = engine.Resume(context.Background(), a.def, a.req)
				}()
				wg.Wait()
				tl.add(a, runErr, resumeErr)
			}
			tl.check(t, trials)
		})
	}
}

// raceTally counts what went wrong over races of drivers on one run.
type raceTally struct{ twice, corrupt, busy, other int }

// add records one race: the drivers' errors and what the run shows after.
func (tl *raceTally) add(a *agent, errs ...error) {
	for _, err := range errs {
		switch {
		case err == nil:
		case errors.Is(err, engine.ErrRunBusy):
			tl.busy++
		default:
			tl.other++
		}
	}
	if len(a.exec.Calls()) > 1 {
		tl.twice++
	}
	if stream, _ := a.def.Store.Load(context.Background(), "r"); recovery.Check("r", stream) != nil {
		tl.corrupt++
	}
}

func (tl *raceTally) check(t *testing.T, trials int) {
	t.Helper()
	if tl.twice+tl.corrupt+tl.other > 0 {
		t.Fatalf("of %d races: never action executed twice in %d, log corrupt in %d, %d errors other than ErrRunBusy",
			trials, tl.twice, tl.corrupt, tl.other)
	}
}

// storeOf opens a new store of the named kind.
func storeOf(t *testing.T, kind string) seams.RunStore {
	if kind == "kv" {
		return openKV(t)
	}
	return &seamstest.MemStore{}
}

// raceDrivers starts each driver function on a's run at once and returns
// their errors.
func raceDrivers(a *agent, drivers ...func(context.Context, engine.Definition, engine.Request) (events.RunResult, error)) []error {
	errs := make([]error, len(drivers))
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i, drive := range drivers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			_, errs[i] = drive(context.Background(), a.def, a.req)
		}()
	}
	close(gate)
	wg.Wait()
	return errs
}

// signalSink closes ch when it receives an event of kind on.
type signalSink struct {
	on   events.Kind
	ch   chan struct{}
	once sync.Once
}

func (s *signalSink) Emit(_ context.Context, e events.Envelope) error {
	if e.Kind == s.on {
		s.once.Do(func() { close(s.ch) })
	}
	return nil
}

func (s *signalSink) Parameters() map[string]string { return map[string]string{"kind": "signal"} }

// TestCancelledRunsKeepEveryExecutedOutcome: 32 runs group-commit on one kv
// store while each is cancelled at a random moment. Every action an
// executor completed has its outcome in the log, and no run, finished or
// resumed, stops with resume_state_unknown over an action that completed.
func TestCancelledRunsKeepEveryExecutedOutcome(t *testing.T) {
	store := openKV(t)
	const runs = 32
	replies := make([]string, 40)
	for i := range replies {
		replies[i] = fmt.Sprintf("ACTION: step %d", i)
	}
	agents := make([]*agent, runs)
	var wg sync.WaitGroup
	for r := range runs {
		a := newAgent(store, fmt.Sprintf("c%02d", r), seamstest.Replies(replies...)...)
		a.req.Budget.MaxSteps, a.req.Budget.MaxActions = 40, 40
		a.req.CancelGrace = 5 * time.Second
		agents[r] = a
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(time.Duration(rand.Int64N(int64(20*time.Millisecond))), cancel)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer cancel()
			if _, err := engine.Run(ctx, a.def, a.req); err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("run %s: %v", a.req.RunID, err)
			}
		}()
	}
	wg.Wait()
	cancelled := 0
	for _, a := range agents {
		stream := soundLog(t, store, a.req.RunID)
		if len(stream) == 0 && len(a.model.Calls()) == 0 {
			continue // cancelled before it began
		}
		r, ok := projections.Fold(stream).Result()
		if !ok {
			t.Fatalf("run %s did not record its end", a.req.RunID)
		}
		if r.StopReason == events.StopCancelled {
			cancelled++
		}
		if r.StopReason == events.StopResumeStateUnknown {
			t.Errorf("run %s stopped resume_state_unknown", a.req.RunID)
		}
		outcomes := map[string]bool{}
		for _, env := range stream {
			if sc, ok := env.Event.(events.StepCompleted); ok && sc.ActionOutcome != nil {
				outcomes[sc.ResultID] = true
			}
		}
		for _, c := range a.exec.Calls() {
			if !outcomes[c.ResultID] {
				t.Errorf("run %s: action %s (step %d) was executed and its outcome is not in the log", a.req.RunID, c.ResultID, c.StepIdx)
			}
		}
	}
	t.Logf("%d of %d runs ended cancelled", cancelled, runs)
}

// slowEmptyLoads is a store whose Load of a run that holds nothing blocks
// until release is closed, signalling entered first: it holds a driver
// inside its read of a run that does not exist yet.
type slowEmptyLoads struct {
	seams.RunStore
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (s *slowEmptyLoads) Load(ctx context.Context, runID string) ([]events.Envelope, error) {
	stream, err := s.RunStore.Load(ctx, runID)
	if err == nil && len(stream) == 0 {
		s.once.Do(func() { close(s.entered); <-s.release })
	}
	return stream, err
}

func (s *slowEmptyLoads) LockRun(runID string) (func(), error) {
	return s.RunStore.(seams.RunLocker).LockRun(runID)
}

// TestARunIsNotRefusedByAResumeOfNothing: a Resume reading a run that does
// not exist yet while a Run starts it must not leave nobody running it.
// The Resume finds nothing (ErrRunNotFound); the Run runs the run.
func TestARunIsNotRefusedByAResumeOfNothing(t *testing.T) {
	for _, kind := range []string{"kv", "memory"} {
		t.Run(kind, func(t *testing.T) {
			a := newAgent(storeOf(t, kind), "r", seamstest.Replies("FINAL: done")...)
			slow := &slowEmptyLoads{RunStore: a.def.Store, entered: make(chan struct{}), release: make(chan struct{})}
			a.def.Store = slow
			resumed := make(chan error, 1)
			go func() { _, err := engine.Resume(context.Background(), a.def, a.req); resumed <- err }()
			<-slow.entered // the Resume is reading the run that is not there
			ran := make(chan error, 1)
			go func() { _, err := engine.Run(context.Background(), a.def, a.req); ran <- err }()
			select {
			case err := <-ran: // the Run did not wait for the Resume's read
				close(slow.release)
				if err != nil {
					t.Fatalf("Run while a Resume read a run that did not exist: %v", err)
				}
			case <-time.After(100 * time.Millisecond): // it waits for it: let the Resume go on
				close(slow.release)
				if err := <-ran; err != nil {
					t.Fatalf("Run while a Resume read a run that did not exist: %v", err)
				}
			}
			if err := <-resumed; err != nil && !errors.Is(err, engine.ErrRunNotFound) && !errors.Is(err, engine.ErrRunBusy) {
				t.Fatalf("Resume: %v", err)
			}
			if r, ok := projections.Fold(soundLog(t, a.def.Store, "r")).Result(); !ok || r.StopReason != events.StopAgentFinished {
				t.Fatalf("nobody ran the run: %+v", r)
			}
		})
	}
}

// TestConcurrentStartsOfOneRunLoseWithErrRunExists: of 8 Runs of one run
// id at once, one runs it and every other is told the run exists, as Run
// promises a second start of a run id, whether it found the log or found
// the id held by the driver starting it.
func TestConcurrentStartsOfOneRunLoseWithErrRunExists(t *testing.T) {
	for _, kind := range []string{"kv", "memory"} {
		t.Run(kind, func(t *testing.T) {
			a := newAgent(storeOf(t, kind), "r", seamstest.Replies("FINAL: done")...)
			drivers := make([]func(context.Context, engine.Definition, engine.Request) (events.RunResult, error), 8)
			for i := range drivers {
				drivers[i] = engine.Run
			}
			won := 0
			for _, err := range raceDrivers(a, drivers...) {
				switch {
				case err == nil:
					won++
				case !errors.Is(err, engine.ErrRunExists):
					t.Errorf("a losing Run: %v, want an error matching engine.ErrRunExists", err)
				}
			}
			if won != 1 {
				t.Errorf("%d Runs ran the run, want 1", won)
			}
		})
	}
}

// recordReservations is a store whose reservations live on the run's own
// record, as pgstore's leases do: its first reservation of a run is taken
// as if the run had no record yet (nothing to hold), and every later one
// is refused while held says another driver holds the run.
type recordReservations struct {
	seams.RunStore
	reserved int
	held     bool
}

func (s *recordReservations) LockRun(runID string) (func(), error) {
	s.reserved++
	if s.reserved > 1 && s.held {
		return nil, fmt.Errorf("run %q: %w by another worker", runID, seams.ErrRunLocked)
	}
	return func() {}, nil
}

// TestARunStartedMeanwhileByAnotherDriverIsBusy: a Run whose reservation
// was taken before the run existed finds it started by another driver: if
// that driver holds it, the error says the run exists and is busy; if it
// let go, only that it exists.
func TestARunStartedMeanwhileByAnotherDriverIsBusy(t *testing.T) {
	for _, held := range []bool{true, false} {
		mem := &seamstest.MemStore{}
		proptest.AppendEach(t, mem, "r", proptest.SoundStream("r")[:2])
		store := &recordReservations{RunStore: mem, held: held}
		a := newAgent(store, "r", seamstest.Replies("FINAL: done")...)
		_, err := engine.Run(context.Background(), a.def, a.req)
		if !errors.Is(err, engine.ErrRunExists) || errors.Is(err, engine.ErrRunBusy) != held {
			t.Errorf("run started meanwhile by another driver (held %v): %v, want ErrRunExists, and ErrRunBusy when held", held, err)
		}
		if store.reserved != 2 {
			t.Errorf("the run was reserved %d times, want 2 (once before loading, once after finding it)", store.reserved)
		}
	}
}
