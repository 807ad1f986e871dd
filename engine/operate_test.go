package engine_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// TestAnInterruptedRunStopsAtTheStepBoundaryAndResumes: closing
// Definition.Interrupt while an action runs lets the step complete (the
// action runs once, its outcome durable), stops the run unfinished before
// the next model call with ErrInterrupted, writes nothing for the stop,
// and Resume finishes the run without running the action again.
func TestAnInterruptedRunStopsAtTheStepBoundaryAndResumes(t *testing.T) {
	store := &seamstest.MemStore{}
	a := newAgent(store, "r", seamstest.Replies("ACTION: ls", "FINAL: 3 files")...)
	stop := make(chan struct{})
	a.def.Interrupt = stop
	a.exec.Respond = func(ctx context.Context, call seams.ActionCall) (events.ActionOutcome, error) {
		close(stop) // the worker shuts down while the action runs
		return events.ActionOutcome{Status: events.StatusExecuted, Observation: "3 files"}, nil
	}
	_, err := engine.Run(context.Background(), a.def, a.req)
	if !errors.Is(err, engine.ErrInterrupted) {
		t.Fatalf("Run: %v, want ErrInterrupted", err)
	}
	log := soundLog(t, store, "r")
	if kinds := kindsOf(log); kinds != "run_started intent model_call_result intent step_completed" {
		t.Fatalf("log after the interrupt: %s, want the step completed and nothing after it", kinds)
	}
	a.def.Interrupt = nil
	a.exec.Respond = nil
	res, err := engine.Resume(context.Background(), a.def, a.req)
	if err != nil || res.StopReason != events.StopAgentFinished || len(res.Steps) != 2 {
		t.Fatalf("Resume: %v %+v, want agent_finished after 2 steps", err, res)
	}
	if calls := a.exec.Calls(); len(calls) != 1 {
		t.Fatalf("the action ran %d times, want once", len(calls))
	}
}

func kindsOf(log []events.Envelope) string {
	var k []string
	for _, env := range log {
		k = append(k, string(env.Kind))
	}
	return strings.Join(k, " ")
}

// TestStartWritesTheRunAndItsAgentOnly: Start makes RunStarted durable,
// with the request's agent and input, and drives nothing; Resume with the
// same request drives the run, and one whose input differs is refused as
// a changed parameter.
func TestStartWritesTheRunAndItsAgentOnly(t *testing.T) {
	store := &seamstest.MemStore{}
	a := newAgent(store, "r", seamstest.Replies("FINAL: done")...)
	a.req.Agent, a.req.Input = "counter", []byte(`{"dir":"."}`)
	env, err := engine.Start(context.Background(), a.def, a.req)
	if err != nil {
		t.Fatal(err)
	}
	started, ok := env.Event.(events.RunStarted)
	if !ok || started.Agent != "counter" || string(started.Input) != `{"dir":"."}` {
		t.Fatalf("Start returned %+v, want the RunStarted with agent counter and its input", env)
	}
	if log := soundLog(t, store, "r"); kindsOf(log) != "run_started" || log[0].ID != env.ID {
		t.Fatalf("log after Start: %s, want RunStarted alone", kindsOf(log))
	}
	if n := len(a.model.Calls()); n != 0 {
		t.Fatalf("Start called the model %d times", n)
	}
	if _, err := engine.Start(context.Background(), a.def, a.req); !errors.Is(err, engine.ErrRunExists) {
		t.Fatalf("a second Start: %v, want ErrRunExists", err)
	}
	other := a.req
	other.Input = []byte(`{"dir":"/"}`)
	if _, err := engine.Resume(context.Background(), a.def, other); !errors.Is(err, engine.ErrParametersChanged) || !strings.Contains(err.Error(), "input: 11 bytes at start") {
		t.Fatalf("Resume with another input: %v, want ErrParametersChanged naming the input", err)
	}
	res, err := engine.Resume(context.Background(), a.def, a.req)
	if err != nil || res.StopReason != events.StopAgentFinished {
		t.Fatalf("Resume: %v %+v", err, res)
	}
}

// TestARequestWithoutAValidAgentIsRefused: an input needs an agent, an
// agent name follows seams.ValidAgent.
func TestARequestWithoutAValidAgentIsRefused(t *testing.T) {
	for _, c := range []struct {
		agent, input, want string
	}{
		{"", "x", "Input is set without an Agent"},
		{"bad\nname", "", "control character"},
		{strings.Repeat("a", seams.MaxAgentBytes+1), "", "longer than the 256-byte limit"},
	} {
		a := newAgent(&seamstest.MemStore{}, "r")
		a.req.Agent, a.req.Input = c.agent, []byte(c.input)
		if _, err := engine.Start(context.Background(), a.def, a.req); !errors.Is(err, engine.ErrInvalidRequest) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("agent %.20q input %q: %v, want ErrInvalidRequest saying %q", c.agent, c.input, err, c.want)
		}
	}
}

// TestACancelRequestedThroughTheStoreStopsTheRunBeforeItsSideEffect: an
// operator cancels a run another driver holds while its model thinks; the
// driver sees the request once the action's intent is durable and ends
// the run cancelled without executing the action.
func TestACancelRequestedThroughTheStoreStopsTheRunBeforeItsSideEffect(t *testing.T) {
	store := &seamstest.MemStore{}
	a := newAgent(store, "r", seamstest.Replies("ACTION: rm -rf build", "FINAL: done")...)
	var cancelled engine.Cancellation
	var cancelErr error
	a.model.OnCall = func(seams.ModelCall) {
		cancelled, cancelErr = engine.Cancel(context.Background(), store, "r", "ops@example")
	}
	res, err := engine.Run(context.Background(), a.def, a.req)
	if err != nil || res.StopReason != events.StopCancelled {
		t.Fatalf("Run: %v %+v, want cancelled", err, res)
	}
	if cancelErr != nil || cancelled.Holder != seamstest.MemOwner || cancelled.Result != nil {
		t.Fatalf("Cancel: %+v %v, want the holder named and the run left to it", cancelled, cancelErr)
	}
	if n := len(a.exec.Calls()); n != 0 {
		t.Fatalf("the action ran %d times after the cancel request", n)
	}
}

// TestCancellingARunNobodyHoldsEndsItAtOnce: a run nobody drives is ended
// by Cancel itself; the side effect its crash left in doubt is named; a
// finished or unknown run is refused.
func TestCancellingARunNobodyHoldsEndsItAtOnce(t *testing.T) {
	store := &seamstest.MemStore{}
	a := newAgent(store, "r", seamstest.Replies("ACTION: pay", "FINAL: paid")...)
	// The crash: the log ends with the action's intent.
	stream := proptestStream(t, store, a)
	c, err := engine.Cancel(context.Background(), store, "r", "ops")
	if err != nil || c.Holder != "" || c.Result == nil || c.Result.StopReason != events.StopCancelled {
		t.Fatalf("Cancel: %+v %v, want the run ended cancelled here", c, err)
	}
	if c.InDoubt == nil || c.InDoubt.ResultID != stream.actionResultID {
		t.Fatalf("Cancel named %+v in doubt, want the action %s", c.InDoubt, stream.actionResultID)
	}
	log := soundLog(t, store, "r")
	if f, ok := log[len(log)-1].Event.(events.RunFinished); !ok || f.Result.StopReason != events.StopCancelled {
		t.Fatalf("the log ends with %s, want run_finished(cancelled)", log[len(log)-1].Kind)
	}
	if _, err := engine.Cancel(context.Background(), store, "r", "ops"); !errors.Is(err, seams.ErrRunFinished) {
		t.Fatalf("cancelling a finished run: %v, want ErrRunFinished", err)
	}
	if _, err := engine.Cancel(context.Background(), store, "nope", "ops"); !errors.Is(err, engine.ErrRunNotFound) {
		t.Fatalf("cancelling an unknown run: %v, want ErrRunNotFound", err)
	}
	if n := len(a.exec.Calls()); n != 0 {
		t.Fatalf("the action ran %d times", n)
	}
}

type crashed struct{ actionResultID string }

// proptestStream leaves run "r" as a crash during its first action leaves
// it: the run is driven on a store whose append after the action's intent
// fails, so the log ends with that intent and the executor never runs.
func proptestStream(t *testing.T, store *seamstest.MemStore, a *agent) crashed {
	t.Helper()
	def := a.def
	def.Store = failAfterActionIntent{store}
	if _, err := engine.Run(context.Background(), def, a.req); err == nil {
		t.Fatal("the crashing run did not fail")
	}
	log := soundLog(t, store, "r")
	last, ok := log[len(log)-1].Event.(events.Intent)
	if !ok || last.IntentKind != events.IntentAction {
		t.Fatalf("the log ends with %s, want an action intent", kindsOf(log))
	}
	return crashed{last.ResultID}
}

// failAfterActionIntent stores the action's intent, then the process
// "dies": the driver's stop as it returns (a lost lease) stands in for it.
type failAfterActionIntent struct{ *seamstest.MemStore }

func (s failAfterActionIntent) HoldsRun(ctx context.Context, runID string) error {
	if log, _ := s.Load(ctx, runID); len(log) > 0 {
		if in, ok := log[len(log)-1].Event.(events.Intent); ok && in.IntentKind == events.IntentAction {
			return errors.New("the process died")
		}
	}
	return nil
}

// cancelWhilePreparing is a store whose caller's context ends as Start
// asks the store for its parameters: a deadline that runs out inside
// Start, before it writes.
type cancelWhilePreparing struct {
	*seamstest.MemStore
	cancel context.CancelFunc
}

func (s cancelWhilePreparing) Parameters() map[string]string {
	s.cancel()
	return s.MemStore.Parameters()
}

// TestStartNeverFinishesTheRunItSubmits: a context that ends while Start
// works does not turn the submitted run into a finished, cancelled one:
// what Start reports written is a run a worker can drive.
func TestStartNeverFinishesTheRunItSubmits(t *testing.T) {
	mem := &seamstest.MemStore{}
	ctx, cancel := context.WithCancel(context.Background())
	a := newAgent(cancelWhilePreparing{mem, cancel}, "r", seamstest.Replies("FINAL: done")...)
	_, err := engine.Start(ctx, a.def, a.req)
	log, _ := mem.Load(context.Background(), "r")
	switch {
	case err == nil && kindsOf(log) != "run_started":
		t.Fatalf("Start succeeded, and the run holds %s: want RunStarted alone", kindsOf(log))
	case err != nil && len(log) > 0:
		t.Fatalf("Start failed (%v), and the run holds %s: want nothing written", err, kindsOf(log))
	}
}

// cancelOnStepCompleted records an operator's cancel request as a step's
// StepCompleted is appended, and the append's answer brings it back (as
// PostgreSQL's RETURNING does): the driver sees it after the append.
type cancelOnStepCompleted struct{ *seamstest.MemStore }

func (s cancelOnStepCompleted) Append(ctx context.Context, runID string, after ulid.ULID, evs ...events.Event) ([]events.Envelope, error) {
	envs, err := s.MemStore.Append(ctx, runID, after, evs...)
	if err == nil && evs[len(evs)-1].Kind() == events.KindStepCompleted {
		s.RequestCancel(ctx, runID, "ops")
	}
	return envs, err
}

// TestACancelSeenAtTheInterruptsBoundaryEndsTheRun: a worker shutting down
// stops its run at the step boundary, but an operator's cancel request
// seen there wins: the run ends cancelled, as the request's holder
// promised, rather than being given back unfinished.
func TestACancelSeenAtTheInterruptsBoundaryEndsTheRun(t *testing.T) {
	store := cancelOnStepCompleted{&seamstest.MemStore{}}
	a := newAgent(store, "r", seamstest.Replies("ACTION: ls", "FINAL: done")...)
	stop := make(chan struct{})
	a.def.Interrupt = stop
	a.exec.Respond = func(ctx context.Context, call seams.ActionCall) (events.ActionOutcome, error) {
		close(stop)
		return events.ActionOutcome{Status: events.StatusExecuted, Observation: "3 files"}, nil
	}
	res, err := engine.Run(context.Background(), a.def, a.req)
	if err != nil || res.StopReason != events.StopCancelled {
		t.Fatalf("Run: %v %+v, want the run ended cancelled", err, res.StopReason)
	}
}

// cancelOnStart records an operator's cancel request as the run's
// RunStarted commits: a Cancel racing the Submit that wrote the run.
type cancelOnStart struct{ *seamstest.MemStore }

func (s cancelOnStart) Append(ctx context.Context, runID string, after ulid.ULID, evs ...events.Event) ([]events.Envelope, error) {
	envs, err := s.MemStore.Append(ctx, runID, after, evs...)
	if err == nil && evs[0].Kind() == events.KindRunStarted {
		s.RequestCancel(ctx, runID, "ops")
	}
	return envs, err
}

// TestStartLeavesACancelRequestToWhoeverTakesTheRun: Start holds nothing,
// so a cancel request that comes as it writes is not its to carry out —
// the operator's Cancel, or the worker that claims the run, ends it. Start
// reports the run it wrote, and writes nothing more.
func TestStartLeavesACancelRequestToWhoeverTakesTheRun(t *testing.T) {
	store := cancelOnStart{&seamstest.MemStore{}}
	a := newAgent(store, "r", seamstest.Replies("FINAL: done")...)
	if _, err := engine.Start(context.Background(), a.def, a.req); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if log := soundLog(t, store, "r"); kindsOf(log) != "run_started" {
		t.Fatalf("after Start the run holds %s, want RunStarted alone", kindsOf(log))
	}
	if c, err := engine.Cancel(context.Background(), store, "r", "ops"); err != nil || c.Result == nil || c.Result.StopReason != events.StopCancelled {
		t.Fatalf("the operator's Cancel: %+v %v, want the run ended cancelled", c, err)
	}
}
