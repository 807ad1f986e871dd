package engine_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// approvalTools: count (safe), refund (never, every call needs approval,
// amount at most 500) and pay (never).
func approvalTools(t *testing.T) *seams.Registry {
	t.Helper()
	ok := func(context.Context, map[string]any) (string, error) { return "done", nil }
	r, err := seams.NewRegistry(
		seams.Tool{Spec: seams.ToolSpec{Name: "count", ReplayPolicy: events.ReplaySafe,
			Parameters: map[string]any{"type": "object", "required": []string{"dir"}}}, Handler: ok},
		seams.Tool{Spec: seams.ToolSpec{Name: "refund", RequiresApproval: true, Parameters: map[string]any{"type": "object",
			"required":   []string{"amount"},
			"properties": map[string]any{"amount": map[string]any{"type": "number", "maximum": 500}}}}, Handler: ok},
		seams.Tool{Spec: seams.ToolSpec{Name: "pay", Parameters: map[string]any{"type": "object", "required": []string{"amount"}}}, Handler: ok},
	)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// approvalAgent is newAgent with approvalTools; its executor is the
// scripted one, which counts executions.
func approvalAgent(t *testing.T, store seams.RunStore, runID string, turns ...string) *agent {
	a := newAgent(store, runID, seamstest.Replies(turns...)...)
	a.req.Tools = approvalTools(t)
	return a
}

// awaiting runs a to the point where it waits for a person and returns
// the pending call.
func awaiting(t *testing.T, a *agent) recovery.PendingCall {
	t.Helper()
	_, err := engine.Run(context.Background(), a.def, a.req)
	var aw *engine.AwaitingError
	if !errors.As(err, &aw) || len(aw.Calls) != 1 {
		t.Fatalf("run %s: %v, want it awaiting one call", a.req.RunID, err)
	}
	return aw.Calls[0]
}

// inDoubt runs a until its first action's intent is durable and crashes
// before its outcome is: the action's outcome is in doubt. It returns the
// action's call id.
func inDoubt(t *testing.T, a *agent) string {
	t.Helper()
	crashing := *a
	crashing.def.Store = &proptest.CrashingStore{Inner: a.def.Store, After: 2} // run_started+intent, reply+action intent
	if _, err := engine.Run(context.Background(), crashing.def, crashing.req); !errors.Is(err, proptest.ErrCrashed) {
		t.Fatalf("crashing run %s: %v", a.req.RunID, err)
	}
	stream, _ := a.def.Store.Load(context.Background(), a.req.RunID)
	v, err := recovery.Classify(a.req.RunID, stream)
	if err != nil || v.State != recovery.ActionUnknown {
		t.Fatalf("run %s after the crash: state %s (%v), want %s", a.req.RunID, v.State, err, recovery.ActionUnknown)
	}
	return v.InDoubt.ResultID
}

// actionOfStep is the result id of step i's action intent in runID's log.
func actionOfStep(t *testing.T, store seams.RunStore, runID string, i int) string {
	t.Helper()
	stream, _ := store.Load(context.Background(), runID)
	for _, env := range stream {
		if in, ok := env.Event.(events.Intent); ok && in.IntentKind == events.IntentAction && in.CallIndex == i {
			return in.ResultID
		}
	}
	t.Fatalf("run %s has no action intent for step %d", runID, i)
	return ""
}

func ptr(s string) *string { return &s }

// TestDecideAndResolveRefuseWritingNothing: every refusal of Decide and
// Resolve, one row each, on the kv store: the error matches its sentinel
// (and no other refusal's), names what is wrong, and not one event of any
// run was written.
func TestDecideAndResolveRefuseWritingNothing(t *testing.T) {
	ctx := context.Background()
	store := openKV(t)

	// "await": step 0 counted (a completed call), step 1 awaits approval.
	awaitRun := approvalAgent(t, store, "await", `TOOL count {"dir":"a"}`, `TOOL refund {"amount":40}`, "FINAL: done")
	pending := awaiting(t, awaitRun)
	completed := actionOfStep(t, store, "await", 0)
	stream, _ := store.Load(ctx, "await")
	modelCall := ""
	for _, env := range stream {
		if in, ok := env.Event.(events.Intent); ok && in.IntentKind == events.IntentModelCall && in.CallIndex == 1 {
			modelCall = in.ResultID
		}
	}
	// "other": another run awaiting approval.
	otherCall := awaiting(t, approvalAgent(t, store, "other", `TOOL refund {"amount":7}`)).Call
	// "decided": approved already.
	decidedCall := awaiting(t, approvalAgent(t, store, "decided", `TOOL refund {"amount":9}`)).Call
	if _, err := engine.Decide(ctx, store, events.Decision{RunID: "decided", ResultID: decidedCall, Verdict: events.VerdictApproved, By: "ana"}); err != nil {
		t.Fatal(err)
	}
	// "doubt": a never action in doubt.
	doubtCall := inDoubt(t, approvalAgent(t, store, "doubt", `TOOL pay {"amount":5}`))
	// "resolved": an action in doubt found not executed.
	resolvedCall := inDoubt(t, approvalAgent(t, store, "resolved", `TOOL pay {"amount":6}`))
	if _, err := engine.Resolve(ctx, store, events.Decision{RunID: "resolved", ResultID: resolvedCall, Verdict: events.VerdictNotExecuted, By: "ops"}); err != nil {
		t.Fatal(err)
	}
	// "finished": a run that finished after its approved action ran.
	finished := approvalAgent(t, store, "finished", `TOOL refund {"amount":3}`, "FINAL: refunded")
	finishedCall := awaiting(t, finished).Call
	if _, err := engine.Decide(ctx, store, events.Decision{RunID: "finished", ResultID: finishedCall, Verdict: events.VerdictApproved, By: "ana"}); err != nil {
		t.Fatal(err)
	}
	if r, err := engine.Resume(ctx, finished.def, finished.req); err != nil || r.StopReason != events.StopAgentFinished {
		t.Fatalf("finished run: %v %v", r.StopReason, err)
	}

	runs := []string{"await", "other", "decided", "doubt", "resolved", "finished"}
	snapshot := func() map[string][]events.Envelope {
		out := map[string][]events.Envelope{}
		for _, id := range runs {
			s, err := store.Load(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			out[id] = s
		}
		return out
	}

	approve := func(run, call string) events.Decision {
		return events.Decision{RunID: run, ResultID: call, Verdict: events.VerdictApproved, By: "ana"}
	}
	executed := func(run, call string) events.Decision {
		return events.Decision{RunID: run, ResultID: call, Verdict: events.VerdictExecuted, By: "ops", Observation: ptr("paid")}
	}
	refusals := []error{engine.ErrNoSuchCall, engine.ErrNotPending, engine.ErrAlreadyDecided, engine.ErrInvalidDecision, engine.ErrRunNotFound, engine.ErrRunBusy}
	for _, c := range []struct {
		name    string
		resolve bool // Resolve, not Decide
		d       events.Decision
		want    error
		says    string // the message names what is wrong
	}{
		{"a call of another run", false, approve("await", otherCall), engine.ErrNoSuchCall, otherCall},
		{"a finding on a call of another run", true, executed("await", doubtCall), engine.ErrNoSuchCall, doubtCall},
		{"a call no run has", false, approve("await", "01NOSUCHCALL"), engine.ErrNoSuchCall, "01NOSUCHCALL"},
		{"a completed call", false, approve("await", completed), engine.ErrNotPending, "step 0 has completed"},
		{"a finding on a completed call", true, executed("await", completed), engine.ErrNotPending, "step 0 has completed"},
		{"a model call", false, approve("await", modelCall), engine.ErrNotPending, "model call of step 1"},
		{"a call decided and completed since", false, approve("finished", finishedCall), engine.ErrAlreadyDecided, `approved by "ana" (the step has completed since)`},
		{"a finding on a call approved and completed since", true, executed("finished", finishedCall), engine.ErrNotPending, "step 0 has completed"},
		{"a finding on a call awaiting approval", true, executed("await", pending.Call), engine.ErrNotPending, "not in doubt"},
		{"an approval of an action in doubt", false, approve("doubt", doubtCall), engine.ErrNotPending, "awaits no approval"},
		{"a rejection of an action in doubt", false, events.Decision{RunID: "doubt", ResultID: doubtCall, Verdict: events.VerdictRejected, By: "ana"},
			engine.ErrNotPending, "awaits no approval"},
		{"an approval decided already", false, approve("decided", decidedCall), engine.ErrAlreadyDecided, `approved by "ana"`},
		{"a rejection of a call approved already", false, events.Decision{RunID: "decided", ResultID: decidedCall, Verdict: events.VerdictRejected, By: "bo"},
			engine.ErrAlreadyDecided, `approved by "ana"`},
		{"a finding made already", true, executed("resolved", resolvedCall), engine.ErrAlreadyDecided, `not_executed by "ops"`},
		{"edited arguments the schema refuses", false, events.Decision{RunID: "await", ResultID: pending.Call, Verdict: events.VerdictApproved,
			By: "ana", Arguments: ptr(`{"amount":9000}`)}, engine.ErrInvalidDecision, "maximum"},
		{"edited arguments missing a required one", false, events.Decision{RunID: "await", ResultID: pending.Call, Verdict: events.VerdictApproved,
			By: "ana", Arguments: ptr(`{"sum":4}`)}, engine.ErrInvalidDecision, "amount"},
		{"edited arguments with a number a call cannot hold exactly", false, events.Decision{RunID: "await", ResultID: pending.Call,
			Verdict: events.VerdictApproved, By: "ana", Arguments: ptr(`{"amount":40,"to_account":12345678901234567}`)},
			engine.ErrInvalidDecision, "12345678901234567"},
		{"edited arguments that are not an object", false, events.Decision{RunID: "await", ResultID: pending.Call, Verdict: events.VerdictApproved,
			By: "ana", Arguments: ptr(`[40]`)}, engine.ErrInvalidDecision, "not a JSON object"},
		{"an approval by nobody", false, events.Decision{RunID: "await", ResultID: pending.Call, Verdict: events.VerdictApproved},
			engine.ErrInvalidDecision, "by is empty"},
		{"a finding by nobody", true, events.Decision{RunID: "doubt", ResultID: doubtCall, Verdict: events.VerdictNotExecuted},
			engine.ErrInvalidDecision, "by is empty"},
		{"no call", false, events.Decision{RunID: "await", Verdict: events.VerdictApproved, By: "ana"}, engine.ErrInvalidDecision, "result_id is empty"},
		{"no verdict", false, events.Decision{RunID: "await", ResultID: pending.Call, By: "ana"}, engine.ErrInvalidDecision, "verdict"},
		{"a finding through Decide", false, executed("doubt", doubtCall), engine.ErrInvalidDecision, "use Resolve"},
		{"an approval through Resolve", true, approve("await", pending.Call), engine.ErrInvalidDecision, "use Decide"},
		{"an observation on a finding of not executed", true, events.Decision{RunID: "doubt", ResultID: doubtCall, Verdict: events.VerdictNotExecuted,
			By: "ops", Observation: ptr("paid")}, engine.ErrInvalidDecision, "observation is set"},
		{"no run id", false, approve("", pending.Call), engine.ErrInvalidDecision, "run id"},
		{"a run without a log", false, approve("nope", pending.Call), engine.ErrRunNotFound, `run "nope"`},
		{"a finding on a run without a log", true, executed("nope", doubtCall), engine.ErrRunNotFound, `run "nope"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := snapshot()
			decide := engine.Decide
			if c.resolve {
				decide = engine.Resolve
			}
			env, err := decide(ctx, store, c.d)
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			for _, other := range refusals {
				if other != c.want && errors.Is(err, other) {
					t.Errorf("err = %v matches %v too", err, other)
				}
			}
			if !strings.Contains(err.Error(), c.says) {
				t.Errorf("err = %q does not say %q", err, c.says)
			}
			if env.Event != nil {
				t.Errorf("a refusal returned an event: %+v", env)
			}
			if after := snapshot(); !reflect.DeepEqual(before, after) {
				t.Errorf("a refusal wrote to the store")
			}
		})
	}

	// The refusals left the awaiting run as it was: it still awaits, and
	// once approved it runs its action once.
	if _, err := engine.Resume(ctx, awaitRun.def, awaitRun.req); !errors.Is(err, engine.ErrAwaitingDecision) {
		t.Fatalf("resume of the awaiting run: %v", err)
	}
	if _, err := engine.Decide(ctx, store, approve("await", pending.Call)); err != nil {
		t.Fatal(err)
	}
	r, err := engine.Resume(ctx, awaitRun.def, awaitRun.req)
	if err != nil || r.StopReason != events.StopAgentFinished || awaitRun.exec.Executions(pending.Call) != 1 {
		t.Fatalf("after the approval: %v %v, executed %d times", r.StopReason, err, awaitRun.exec.Executions(pending.Call))
	}
	soundLog(t, store, "await")
}

// TestEditedArgumentsAreRecordedAsTheyRun: an approval's edited arguments
// are recorded in the form the action runs with — decoded as every tool
// call's arguments are, encoded again — so the decision, the executed
// call and the step's tool_arguments say the same.
func TestEditedArgumentsAreRecordedAsTheyRun(t *testing.T) {
	ctx := context.Background()
	store := openKV(t)
	a := approvalAgent(t, store, "edit", `TOOL refund {"amount":400}`, "FINAL: refunded")
	call := awaiting(t, a).Call
	env, err := engine.Decide(ctx, store, events.Decision{RunID: "edit", ResultID: call, Verdict: events.VerdictApproved, By: "ana",
		Arguments: ptr(`{ "amount" : 4.50e1, "fee": 0.1, "memo": "café" }`)})
	if err != nil {
		t.Fatal(err)
	}
	const runs = `{"amount":45,"fee":0.1,"memo":"café"}`
	if got := *env.Event.(events.Decision).Arguments; got != runs {
		t.Errorf("recorded arguments %s, want %s", got, runs)
	}
	if _, err := engine.Resume(ctx, a.def, a.req); err != nil {
		t.Fatal(err)
	}
	calls := a.exec.Calls()
	if len(calls) != 1 || !reflect.DeepEqual(calls[0].Action.ToolCall.Arguments, map[string]any{"amount": 45.0, "fee": 0.1, "memo": "café"}) {
		t.Fatalf("executed %+v, want refund once with the edited arguments", calls)
	}
	stream, _ := store.Load(ctx, "edit")
	for _, env := range stream {
		if sc, ok := env.Event.(events.StepCompleted); ok && sc.ResultID == call && *sc.Step.ToolArguments != runs {
			t.Errorf("step record tool_arguments %s, want %s", *sc.Step.ToolArguments, runs)
		}
	}
}

// TestACancelRequestedWhileADecideHeldTheRunIsNotLost: an operator's
// cancel that came while the run was held (here by hand, as a Decide
// holds it) is left to the holder, which a Decide does not carry out; the
// request stays, and the next driver — after the decision — ends the run
// cancelled, the approved action never executed.
func TestACancelRequestedWhileADecideHeldTheRunIsNotLost(t *testing.T) {
	ctx := context.Background()
	store := openKV(t)
	a := approvalAgent(t, store, "held", `TOOL refund {"amount":40}`, "FINAL: refunded")
	call := awaiting(t, a).Call
	release, err := store.LockRun("held")
	if err != nil {
		t.Fatal(err)
	}
	if holder, err := store.RequestCancel(ctx, "held", "ops"); err != nil || holder == "" {
		t.Fatalf("cancel request while held: holder %q, %v; want it left to the holder", holder, err)
	}
	release()
	if _, err := engine.Decide(ctx, store, events.Decision{RunID: "held", ResultID: call, Verdict: events.VerdictApproved, By: "ana"}); err != nil {
		t.Fatal(err)
	}
	r, err := engine.Resume(ctx, a.def, a.req)
	if err != nil || r.StopReason != events.StopCancelled || a.exec.Executions(call) != 0 {
		t.Fatalf("after the decision: %v %v, %d executions; want cancelled, the refund never made", r.StopReason, err, a.exec.Executions(call))
	}
	stream, _ := store.Load(ctx, "held")
	if n := len(stream); stream[n-2].Kind != events.KindDecision || stream[n-1].Kind != events.KindRunFinished {
		t.Fatalf("the log ends %s, %s; want the decision, then run_finished", stream[n-2].Kind, stream[n-1].Kind)
	}
}
