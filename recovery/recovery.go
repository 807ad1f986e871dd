package recovery

import (
	"errors"
	"fmt"
	"strings"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
)

// ErrCorrupt is wrapped by every *CorruptError.
var ErrCorrupt = errors.New("recovery: log is corrupt")

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
)

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
	}
	return string(p)
}

// PlanFor is the recovery table: what Resume does in state s, given the
// replay policy of the side effect in doubt (ignored by the other rows).
// Only ReplaySafe replays a side effect in doubt; any other policy, an
// empty or unknown one included, stops the run with resume_state_unknown.
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
	// (ModelCallUnknown, ActionUnknown); nil otherwise.
	InDoubt *events.Intent
	Plan    Plan
	// Result is the recorded result of a finished run, steps included.
	Result *events.RunResult

	steps []events.StepRecord
}

// Steps returns the trajectory recorded so far.
func (v Verdict) Steps() []events.StepRecord { return append([]events.StepRecord{}, v.steps...) }

// Classify checks runID's stream and places its tail in the recovery table.
// A log that breaks a structural rule yields a *CorruptError.
func Classify(runID string, stream []events.Envelope) (Verdict, error) {
	return classified(runID, stream).Verdict(nil)
}

// A Classifier is Classify one event at a time, for a reader that streams a
// run's events instead of holding them (a resume of a long run): Add each
// event in order, then Verdict. Sound reports whether the events added so
// far break no rule, so a caller can stop relying on them at the first
// that does.
type Classifier struct{ w walker }

// NewClassifier classifies runID's stream.
func NewClassifier(runID string) *Classifier { return &Classifier{walker{runID: runID}} }

// Add checks the stream's next event.
func (c *Classifier) Add(env events.Envelope) { c.w.add(env) }

// Sound reports whether the events added so far break no structural rule.
func (c *Classifier) Sound() bool { return len(c.w.reasons) == 0 }

// Events is how many events were added.
func (c *Classifier) Events() int { return c.w.n }

// Verdict is Classify's result for the events added; loadErr is what the
// store's read returned, as for ClassifyLoaded.
func (c *Classifier) Verdict(loadErr error) (Verdict, error) {
	if loadErr == nil {
		return c.w.verdict()
	}
	return Verdict{}, damaged(c.w.runID, loadErr, c.w.reasons)
}

func (w *walker) verdict() (Verdict, error) {
	if len(w.reasons) > 0 {
		return Verdict{}, &CorruptError{RunID: w.runID, Reasons: w.reasons}
	}
	v := Verdict{RunID: w.runID, Step: w.step, State: w.state(), steps: w.steps}
	if v.State == Finished {
		r := *w.result
		usage := w.usage
		r.Steps, r.Usage = w.steps, &usage
		v.Result = &r
	}
	switch v.State {
	case ModelCallUnknown:
		v.InDoubt = w.model
	case ActionUnknown:
		v.InDoubt = w.action
	}
	policy := events.ReplayNever
	if v.InDoubt != nil {
		policy = v.InDoubt.ReplayPolicy
	}
	v.Plan = PlanFor(v.State, policy)
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

// walker folds a stream through the structural rules.
type walker struct {
	runID    string
	started  bool
	finished bool
	result   *events.RunResult
	steps    []events.StepRecord
	step     int // index of the step in progress or next
	model    *events.Intent
	reply    bool // model result present
	failed   bool // model result is a failure
	action   *events.Intent
	reasons  []string
	usage    events.UsageTotals // of the replies
	n        int                // events added
	prev     ulid.ULID          // the last event's key
}

func (w *walker) state() State {
	switch {
	case !w.started:
		return Empty
	case w.finished:
		return Finished
	case w.model == nil:
		return BetweenSteps
	case !w.reply:
		return ModelCallUnknown
	case w.failed:
		return KnownFailure
	case w.action == nil:
		return ReplyStored
	}
	return ActionUnknown
}

// classified is a Classifier that has checked every event of stream,
// stored under runID (every event must name that run).
func classified(runID string, stream []events.Envelope) *Classifier {
	c := NewClassifier(runID)
	for _, env := range stream {
		c.Add(env)
	}
	return c
}

func (w *walker) bad(i int, env events.Envelope, format string, a ...any) {
	w.reasons = append(w.reasons, fmt.Sprintf("event %d (%s %s): %s", i, env.Kind, env.ID, fmt.Sprintf(format, a...)))
}

// add checks the stream's next event against what came before it.
func (w *walker) add(env events.Envelope) {
	i := w.n
	w.n++
	defer func() { w.prev = env.ID }()
	if _, ok := env.Event.(events.RunStarted); !ok && i == 0 {
		w.bad(0, env, "the first event is not run_started")
	}
	if env.Event == nil {
		w.bad(i, env, "no event")
		return
	}
	if id := events.RunIDOf(env.Event); id != w.runID {
		w.bad(i, env, "belongs to run %q, not %q", id, w.runID)
	}
	if err := env.Event.Validate(); err != nil {
		w.bad(i, env, "invalid record: %v", err)
	}
	if i > 0 && env.ID.Compare(w.prev) <= 0 {
		w.bad(i, env, "key is not after the previous event's key")
	}
	if w.finished {
		w.bad(i, env, "follows run_finished")
		return
	}
	switch ev := env.Event.(type) {
	case events.RunStarted:
		if i > 0 {
			w.bad(i, env, "a second run_started")
		}
		w.started = true
	case events.Intent:
		w.intent(i, env, ev)
	case events.ModelCallResult:
		switch {
		case w.model == nil:
			w.bad(i, env, "model result %q without a model intent", ev.ResultID)
		case w.reply:
			w.bad(i, env, "a second model result for step %d", w.step)
		case ev.ResultID != w.model.ResultID:
			w.bad(i, env, "model result %q does not match the intent's result id %q", ev.ResultID, w.model.ResultID)
		default:
			w.reply, w.failed = true, ev.Failure != nil
			if ev.Reply != nil {
				w.usage.Add(ev.Reply.Usage)
			}
		}
	case events.StepCompleted:
		w.stepCompleted(i, env, ev)
	case events.RunFinished:
		if w.model != nil {
			switch ev.Result.StopReason {
			case events.StopCancelled, events.StopResumeStateUnknown:
				// A run may stop with a side effect in doubt.
			default:
				w.bad(i, env, "run finished (%s) with step %d unfinished", ev.Result.StopReason, w.step)
			}
		}
		r := ev.Result
		w.finished, w.result = true, &r
	}
}

func (w *walker) intent(i int, env events.Envelope, ev events.Intent) {
	if ev.IntentKind == events.IntentModelCall {
		switch {
		case w.model != nil && ev.CallIndex == w.step:
			w.bad(i, env, "a second model intent for step %d", w.step)
		case w.model != nil:
			w.bad(i, env, "model intent for step %d ahead of unfinished step %d", ev.CallIndex, w.step)
		case ev.CallIndex != w.step:
			w.bad(i, env, "model intent for step %d, expected step %d: step indexes are not contiguous", ev.CallIndex, w.step)
		default:
			in := ev
			w.model = &in
		}
		return
	}
	switch {
	case w.model == nil:
		w.bad(i, env, "action intent for step %d without a model intent", ev.CallIndex)
	case w.action != nil:
		w.bad(i, env, "a second action intent for step %d", w.step)
	case ev.CallIndex != w.step:
		w.bad(i, env, "action intent for step %d inside step %d", ev.CallIndex, w.step)
	case !w.reply || w.failed:
		w.bad(i, env, "action intent for step %d without a model reply", w.step)
	default:
		in := ev
		w.action = &in
	}
}

func (w *walker) stepCompleted(i int, env events.Envelope, ev events.StepCompleted) {
	switch {
	case w.model == nil:
		w.bad(i, env, "step %d completed without a model intent", ev.Step.StepIdx)
	case ev.Step.StepIdx != w.step:
		w.bad(i, env, "step index %d, expected %d: step indexes are not contiguous", ev.Step.StepIdx, w.step)
	case !w.reply:
		w.bad(i, env, "step %d completed without a model result", w.step)
	}
	switch {
	case ev.ResultID != "" && w.action == nil:
		w.bad(i, env, "step result %q without an action intent", ev.ResultID)
	case ev.ResultID != "" && ev.ResultID != w.action.ResultID:
		w.bad(i, env, "step result %q does not match the action intent's %q", ev.ResultID, w.action.ResultID)
	case ev.ResultID == "" && w.action != nil:
		w.bad(i, env, "step %d wrote an action intent but its step_completed has no result_id", w.step)
	case ev.ResultID != "" && ev.ActionOutcome == nil:
		w.bad(i, env, "step %d closes action intent %q without an outcome", w.step, ev.ResultID)
	}
	w.steps = append(w.steps, ev.Step)
	w.step++
	w.model, w.reply, w.failed, w.action = nil, false, false, nil
}
