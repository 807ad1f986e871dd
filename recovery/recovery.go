package recovery

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// ErrCorrupt is wrapped by every *CorruptError. It matches
// events.ErrCorruption, as every layer's damage does.
var ErrCorrupt = events.NewCorruption("recovery: log is corrupt")

// CorruptError lists every structural rule a log breaks.
type CorruptError struct {
	RunID   string
	Reasons []string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("recovery: log of run %q is corrupt (%d problems):\n  %s", e.RunID, len(e.Reasons), strings.Join(e.Reasons, "\n  "))
}

// Unwrap returns ErrCorrupt.
func (e *CorruptError) Unwrap() error { return ErrCorrupt }

// State is where a log's tail stands, a row of the recovery table.
type State string

// The rows of the table.
const (
	Empty            State = "empty"              // no events at all
	BetweenSteps     State = "between_steps"      // no step in progress
	ModelCallUnknown State = "model_call_unknown" // model intent, no result
	KnownFailure     State = "known_failure"      // model failure, step not completed
	ReplyStored      State = "reply_stored"       // reply, no action intent, step not completed
	ActionUnknown    State = "action_unknown"     // action intent, step not completed
	Finished         State = "finished"           // RunFinished written

	// The rows of human decisions (schema 1.5).
	AwaitingApproval   State = "awaiting_approval"   // action intent awaiting approval, no decision
	Approved           State = "approved"            // approved, its executing intent not written
	Rejected           State = "rejected"            // rejected, step not completed
	AwaitingResolution State = "awaiting_resolution" // action in doubt awaiting an operator's finding
	Resolved           State = "resolved"            // finding recorded, step not completed
)

// Status is the run status of a sound log whose tail is in state s:
// finished; in_doubt where a side effect's outcome is unknown;
// awaiting_approval and awaiting_resolution where an action waits for a
// person; running otherwise. A state is that status made finer (which
// breakpoint), never a second word for it.
func (s State) Status() seams.RunStatus {
	switch s {
	case Finished:
		return seams.StatusFinished
	case ModelCallUnknown, ActionUnknown:
		return seams.StatusInDoubt
	case AwaitingApproval:
		return seams.StatusAwaitingApproval
	case AwaitingResolution:
		return seams.StatusAwaitingResolution
	}
	return seams.StatusRunning
}

// Plan is what Resume does with a state: a short identifier (for JSON and
// for programs to compare); Describe says it in words.
type Plan string

// The plans.
const (
	PlanNone          Plan = "none"
	PlanReturnResult  Plan = "return_result"
	PlanNextStep      Plan = "next_step"
	PlanCallAgain     Plan = "call_again"
	PlanExecuteAgain  Plan = "execute_again"
	PlanStopUnknown   Plan = "stop_unknown"
	PlanCompleteError Plan = "complete_llm_error"
	PlanReparse       Plan = "reparse"

	// The plans of human decisions (schema 1.5).
	PlanAwaitDecision    Plan = "await_decision"
	PlanExecuteApproved  Plan = "execute_approved"
	PlanCompleteRejected Plan = "complete_rejected"
	PlanAwaitResolution  Plan = "await_resolution"
	PlanCompleteResolved Plan = "complete_resolved"
)

// Describe is the plan in words, for people.
func (p Plan) Describe() string {
	switch p {
	case PlanNone:
		return "nothing to resume"
	case PlanReturnResult:
		return "return the recorded result, write nothing"
	case PlanNextStep:
		return "run the next step"
	case PlanCallAgain:
		return "call the model again with the same result id"
	case PlanExecuteAgain:
		return "execute the action again with the same result id"
	case PlanStopUnknown:
		return "finish with resume_state_unknown"
	case PlanCompleteError:
		return "complete the step as llm_error"
	case PlanReparse:
		return "re-parse the stored reply without a model call"
	case PlanAwaitDecision:
		return "wait for a person's decision, write nothing"
	case PlanExecuteApproved:
		return "write the approved action's intent, then execute it with the same result id"
	case PlanCompleteRejected:
		return "complete the step not executed: rejected by the reviewer"
	case PlanAwaitResolution:
		return "record that the action in doubt awaits an operator's finding, then wait"
	case PlanCompleteResolved:
		return "complete the step as the operator found it, executing nothing"
	}
	return string(p)
}

// PlanFor is the recovery table: what Resume does in state s, given the
// replay policy of the side effect in doubt (ignored by the other rows).
// Only ReplaySafe replays a side effect in doubt; any other policy, an
// empty or unknown one included, stops the run with resume_state_unknown
// (PlanAwaitResolution instead for an action, when the run's parameters
// ask that it await an operator: Fold.Plan reads them).
func PlanFor(s State, policy events.ReplayPolicy) Plan {
	switch s {
	case Finished:
		return PlanReturnResult
	case BetweenSteps:
		return PlanNextStep
	case ModelCallUnknown:
		if policy == events.ReplaySafe {
			return PlanCallAgain
		}
		return PlanStopUnknown
	case KnownFailure:
		return PlanCompleteError
	case ReplyStored:
		return PlanReparse
	case ActionUnknown:
		if policy == events.ReplaySafe {
			return PlanExecuteAgain
		}
		return PlanStopUnknown
	case AwaitingApproval, AwaitingResolution:
		return PlanAwaitDecision
	case Approved:
		return PlanExecuteApproved
	case Rejected:
		return PlanCompleteRejected
	case Resolved:
		return PlanCompleteResolved
	}
	return PlanNone
}

// Verdict is a sound log's classification.
type Verdict struct {
	RunID string
	State State
	// Step is the index of the step in progress, or of the next step.
	Step int
	// InDoubt is the intent whose side effect's outcome is unknown
	// (ModelCallUnknown, ActionUnknown, AwaitingResolution); nil
	// otherwise.
	InDoubt *events.Intent
	Plan    Plan
	// Result is the recorded result of a finished run, steps included.
	Result *events.RunResult
	// Pending is the call awaiting a person's decision (AwaitingApproval,
	// AwaitingResolution), nil otherwise.
	Pending *PendingCall

	steps []events.StepRecord
}

// Steps returns the trajectory recorded so far.
func (v Verdict) Steps() []events.StepRecord { return append([]events.StepRecord{}, v.steps...) }

// Classify checks runID's stream and places its tail in the recovery table.
// A log that breaks a structural rule yields a *CorruptError.
func Classify(runID string, stream []events.Envelope) (Verdict, error) {
	return classified(runID, stream).Verdict(nil)
}

// A Classifier is the Fold of a run's log with the structural rules checked
// at every event: Apply each event in order, then Verdict. An event that
// breaks a rule is recorded as a reason and, where folding it would muddle
// the step in progress (a second intent or result), left out of the fold.
// Sound reports whether the events applied so far break no rule, so a caller
// can stop relying on them at the first that does. It classifies a stream
// one event at a time, so a reader streaming a long run need not hold it.
type Classifier struct {
	runID   string
	fold    Fold
	reasons []string
	n       int       // events applied
	prev    ulid.ULID // the last event's key
	acted   time.Time // when the latest action intent folded was written
}

// NewClassifier classifies runID's stream.
func NewClassifier(runID string) *Classifier { return &Classifier{runID: runID} }

// Fold is the fold of the events applied (those the rules let in).
func (c *Classifier) Fold() *Fold { return &c.fold }

// Sound reports whether the events applied so far break no structural rule.
func (c *Classifier) Sound() bool { return len(c.reasons) == 0 }

// Events is how many events were applied.
func (c *Classifier) Events() int { return c.n }

// Verdict is Classify's result for the events applied; loadErr is what the
// store's read returned, as for ClassifyLoaded.
func (c *Classifier) Verdict(loadErr error) (Verdict, error) {
	if loadErr != nil {
		return Verdict{}, damaged(c.runID, loadErr, c.reasons)
	}
	reasons := c.reasons
	if c.fold.Copying() {
		reasons = append(slices.Clip(reasons), fmt.Sprintf("the fork's log ends inside the prefix it copied from %q: %d of %d steps",
			c.fold.Fork.Run, len(c.fold.Steps), c.fold.Fork.Step))
	}
	if len(reasons) > 0 {
		return Verdict{}, &CorruptError{RunID: c.runID, Reasons: reasons}
	}
	f := &c.fold
	v := Verdict{RunID: c.runID, Step: len(f.Steps), State: f.State(), InDoubt: f.InDoubt(), Plan: f.Plan(), steps: f.Steps}
	if r, ok := f.Result(); ok {
		v.Result = &r
	}
	if in := f.Pending(); in != nil {
		p := PendingCallOf(*in, c.acted)
		v.Pending = &p
	}
	return v, nil
}

// ClassifyLoaded is Classify for what a store's Load returned: when loadErr
// wraps an *events.DamageError (values that did not decode or failed their
// checksum, events missing), the log is corrupt, and the *CorruptError lists
// every damaged value and every structural problem of what did decode. Any
// other loadErr is a store failure and is returned as it is.
func ClassifyLoaded(runID string, stream []events.Envelope, loadErr error) (Verdict, error) {
	return classified(runID, stream).Verdict(loadErr)
}

// damaged is the error for a read that returned loadErr: a *CorruptError
// listing the damage and the structural reasons of what did decode when
// loadErr wraps an *events.DamageError; loadErr itself otherwise.
func damaged(runID string, loadErr error, structural []string) error {
	var damage *events.DamageError
	if !errors.As(loadErr, &damage) {
		return loadErr
	}
	reasons := make([]string, 0, len(damage.Problems)+len(structural))
	for _, p := range damage.Problems {
		reasons = append(reasons, "damaged: "+p.Error())
	}
	return &CorruptError{RunID: runID, Reasons: append(reasons, structural...)}
}

// Check reports whether runID's stream is structurally sound: nil, or a
// *CorruptError listing every reason.
func Check(runID string, stream []events.Envelope) error {
	_, err := Classify(runID, stream)
	return err
}

// classified is a Classifier that has checked every event of stream,
// stored under runID (every event must name that run).
func classified(runID string, stream []events.Envelope) *Classifier {
	c := NewClassifier(runID)
	for _, env := range stream {
		c.Apply(env)
	}
	return c
}

func (c *Classifier) bad(i int, env events.Envelope, format string, a ...any) {
	c.reasons = append(c.reasons, fmt.Sprintf("event %d (%s %s): %s", i, env.Kind, env.ID, fmt.Sprintf(format, a...)))
}

// Apply checks the stream's next event against what came before it, and
// folds it.
func (c *Classifier) Apply(env events.Envelope) {
	i := c.n
	c.n++
	defer func() { c.prev = env.ID }()
	if _, ok := env.Event.(events.RunStarted); !ok && i == 0 {
		c.bad(0, env, "the first event is not run_started")
	}
	if env.Event == nil {
		c.bad(i, env, "no event")
		return
	}
	switch id := events.RunIDOf(env.Event); {
	case i == 0 || !c.fold.Copying():
		if id != c.runID {
			c.bad(i, env, "belongs to run %q, not %q", id, c.runID)
		}
	case id != c.fold.Fork.RunOfStep(len(c.fold.Steps)):
		// The prefix a fork copied is its source's (and, for a fork of a
		// fork, its ancestors'), payloads as stored.
		c.bad(i, env, "belongs to run %q, inside the prefix copied from %q: step %d is %q's", id, c.fold.Fork.Run,
			len(c.fold.Steps), c.fold.Fork.RunOfStep(len(c.fold.Steps)))
	}
	if err := env.Event.Validate(); err != nil {
		c.bad(i, env, "invalid record: %v", err)
	}
	if i > 0 && env.ID.Compare(c.prev) <= 0 {
		c.bad(i, env, "key is not after the previous event's key")
	}
	f := &c.fold
	if f.Finished != nil {
		c.bad(i, env, "follows run_finished")
		return
	}
	step, cur := len(f.Steps), &f.Current
	fold := true
	switch ev := env.Event.(type) {
	case events.RunStarted:
		if i > 0 {
			c.bad(i, env, "a second run_started")
		}
	case events.Intent:
		fold = c.intent(i, env, ev)
	case events.ModelCallResult:
		fold = false
		switch {
		case cur.Model == nil:
			c.bad(i, env, "model result %q without a model intent", ev.ResultID)
		case cur.Reply != nil || cur.Failure != nil:
			c.bad(i, env, "a second model result for step %d", step)
		case ev.ResultID != cur.Model.ResultID:
			c.bad(i, env, "model result %q does not match the intent's result id %q", ev.ResultID, cur.Model.ResultID)
		default:
			fold = true
		}
	case events.StepCompleted:
		c.stepCompleted(i, env, ev)
	case events.Decision:
		fold = c.decision(i, env, ev)
	case events.RunFinished:
		if cur.Model != nil {
			switch ev.Result.StopReason {
			case events.StopCancelled, events.StopResumeStateUnknown:
				// A run may stop with a side effect in doubt.
			default:
				c.bad(i, env, "run finished (%s) with step %d unfinished", ev.Result.StopReason, step)
			}
		}
	}
	if fold {
		if in, ok := env.Event.(events.Intent); ok && in.IntentKind == events.IntentAction {
			c.acted = env.Time()
		}
		f.Apply(env.Event)
	}
}

// intent checks an intent; false leaves it out of the fold.
func (c *Classifier) intent(i int, env events.Envelope, ev events.Intent) bool {
	step, cur := len(c.fold.Steps), &c.fold.Current
	if ev.IntentKind == events.IntentModelCall {
		switch {
		case cur.Model != nil && ev.CallIndex == step:
			c.bad(i, env, "a second model intent for step %d", step)
		case cur.Model != nil:
			c.bad(i, env, "model intent for step %d ahead of unfinished step %d", ev.CallIndex, step)
		case ev.CallIndex != step:
			c.bad(i, env, "model intent for step %d, expected step %d: step indexes are not contiguous", ev.CallIndex, step)
		default:
			return true
		}
		return false
	}
	switch {
	case cur.Model == nil:
		c.bad(i, env, "action intent for step %d without a model intent", ev.CallIndex)
	case cur.Action != nil:
		return c.laterAction(i, env, ev)
	case ev.Awaits == events.AwaitsResolution:
		c.bad(i, env, "action intent for step %d awaits resolution, but no action of the step is in doubt", step)
	case ev.CallIndex != step:
		c.bad(i, env, "action intent for step %d inside step %d", ev.CallIndex, step)
	case cur.Reply == nil:
		c.bad(i, env, "action intent for step %d without a model reply", step)
	default:
		return true
	}
	return false
}

// laterAction checks a step's second or third action intent: the one that
// executes an approved action, or the one that says an action in doubt
// awaits an operator's finding. Both repeat the first one's result id,
// tool and policy. false leaves it out of the fold.
func (c *Classifier) laterAction(i int, env events.Envelope, ev events.Intent) bool {
	step, cur := len(c.fold.Steps), &c.fold.Current
	prev := cur.Action
	switch state := c.fold.State(); {
	case ev.CallIndex != step:
		c.bad(i, env, "action intent for step %d inside step %d", ev.CallIndex, step)
	case ev.ResultID != prev.ResultID || ev.ToolName != prev.ToolName || ev.ReplayPolicy != prev.ReplayPolicy:
		c.bad(i, env, "a second action intent for step %d (result %q, tool %q, policy %s) is not the first's (%q, %q, %s)",
			step, ev.ResultID, ev.ToolName, ev.ReplayPolicy, prev.ResultID, prev.ToolName, prev.ReplayPolicy)
	case state == Approved && ev.Awaits == "":
		return true // the approved action, executed now
	case state == ActionUnknown && ev.Awaits == events.AwaitsResolution:
		return true // the action in doubt awaits a finding
	default:
		c.bad(i, env, "a second action intent for step %d (awaits %q) in state %s", step, ev.Awaits, state)
	}
	return false
}

// decision checks a person's decision: on the step's action intent, an
// approval's answer only while it awaits one, a finding only on an action
// that was executed (or may have been) and is not yet completed, each
// once. false leaves it out of the fold.
func (c *Classifier) decision(i int, env events.Envelope, ev events.Decision) bool {
	cur := &c.fold.Current
	switch state := c.fold.State(); {
	case cur.Action == nil:
		c.bad(i, env, "decision on %q without a pending action intent", ev.ResultID)
	case ev.ResultID != cur.Action.ResultID:
		c.bad(i, env, "decision on %q, but the step's action intent is %q", ev.ResultID, cur.Action.ResultID)
	case !ev.Verdict.Resolves() && state != AwaitingApproval:
		c.bad(i, env, "decision %s on %q in state %s: the action does not await approval", ev.Verdict, ev.ResultID, state)
	case ev.Verdict.Resolves() && state != ActionUnknown && state != AwaitingResolution:
		c.bad(i, env, "finding %s on %q in state %s: the action's outcome is not in doubt", ev.Verdict, ev.ResultID, state)
	default:
		return true
	}
	return false
}

// stepCompleted checks a step's completion; it is always folded, so the
// steps after it are checked against the next index.
func (c *Classifier) stepCompleted(i int, env events.Envelope, ev events.StepCompleted) {
	step, cur := len(c.fold.Steps), &c.fold.Current
	switch {
	case cur.Model == nil:
		c.bad(i, env, "step %d completed without a model intent", ev.Step.StepIdx)
	case ev.Step.StepIdx != step:
		c.bad(i, env, "step index %d, expected %d: step indexes are not contiguous", ev.Step.StepIdx, step)
	case cur.Reply == nil && cur.Failure == nil:
		c.bad(i, env, "step %d completed without a model result", step)
	}
	switch {
	case ev.ResultID != "" && cur.Action == nil:
		c.bad(i, env, "step result %q without an action intent", ev.ResultID)
	case ev.ResultID != "" && ev.ResultID != cur.Action.ResultID:
		c.bad(i, env, "step result %q does not match the action intent's %q", ev.ResultID, cur.Action.ResultID)
	case ev.ResultID == "" && cur.Action != nil:
		c.bad(i, env, "step %d wrote an action intent but its step_completed has no result_id", step)
	case ev.ResultID != "" && ev.ActionOutcome == nil:
		c.bad(i, env, "step %d closes action intent %q without an outcome", step, ev.ResultID)
	case ev.ActionOutcome == nil:
	default:
		c.decided(i, env, ev.ActionOutcome.Status)
	}
}

// decided checks that a completed step's outcome is one its decisions
// allow: nothing completes while awaiting a person; an action that never
// got its executing intent (awaiting approval, rejected, or approved with
// arguments that then failed validation) was not executed; a finding is
// the outcome recorded.
func (c *Classifier) decided(i int, env events.Envelope, status events.ActionStatus) {
	step, cur := len(c.fold.Steps), &c.fold.Current
	switch state := c.fold.State(); state {
	case AwaitingApproval, AwaitingResolution:
		c.bad(i, env, "step %d completed while its action awaits a person's decision", step)
	case Approved, Rejected:
		if status != events.StatusNotExecuted {
			c.bad(i, env, "step %d completed %s, but its action was never executed (%s, no executing intent)", step, status, state)
		}
	case Resolved:
		if string(status) != string(cur.Resolution.Verdict) {
			c.bad(i, env, "step %d completed %s, but the operator found it %s", step, status, cur.Resolution.Verdict)
		}
	}
}
