package recovery

import (
	"time"

	"github.com/polyloop/polyloop/events"
)

// Fold is a run's log folded event by event: the steps completed, the step
// in progress, the token usage of the replies and the recorded end, and
// from them where the tail stands (State), what Resume does there (Plan)
// and the run's result (Result). Apply is its one verb. It is what the
// engine's machine is made of, what the Classifier checks each event
// against, and what the projections and readers present; folding a stream
// event by event gives what folding it whole gives.
//
// A Fold trusts its events: a Classifier judges them first.
type Fold struct {
	Started bool
	// AwaitResolution: the run's parameters ask that a never action in
	// doubt await an operator's finding (engine.Request.AwaitResolution,
	// the snapshot's await_resolution) rather than end the run.
	AwaitResolution bool
	// Fork is where a forked run came from (RunStarted.Fork), nil for a
	// run that is no fork. Its first Fork.Step steps are the source's,
	// copied.
	Fork *events.ForkOrigin
	// Steps are the step records in stream order. A Result shares them.
	Steps []events.StepRecord
	// Usage sums the replies' token usage (failed calls report none).
	Usage events.UsageTotals
	// Current is the step in progress (all nil between steps).
	Current Step
	// Finished is the run's end as recorded (its result without steps or
	// usage), nil while the run has not finished.
	Finished *events.RunFinished
	// Events counts the events applied.
	Events int
}

// Step is the step in progress: its model intent (nil between steps), the
// model call's reply or failure (both nil until it is stored), the action
// intent (nil until written; the latest of the step's action intents,
// which share one result id: one awaiting approval, the one executing it
// once approved, one awaiting resolution of its outcome), and the
// decisions on it: Decision an approval's answer, Resolution an
// operator's finding on an outcome in doubt.
type Step struct {
	Model      *events.Intent
	Reply      *events.ModelReply
	Failure    *string
	Action     *events.Intent
	Decision   *events.Decision
	Resolution *events.Decision
}

// Apply folds one event.
func (f *Fold) Apply(ev events.Event) {
	f.Events++
	switch ev := ev.(type) {
	case events.RunStarted:
		f.Started = true
		f.AwaitResolution = ev.ParameterSnapshot[AwaitResolutionKey] == "true"
		f.Fork = ev.Fork
	case events.Intent:
		if ev.IntentKind == events.IntentModelCall {
			f.Current = Step{Model: &ev}
		} else {
			f.Current.Action = &ev
		}
	case events.ModelCallResult:
		f.Current.Reply, f.Current.Failure = ev.Reply, ev.Failure
		if ev.Reply != nil {
			f.Usage.Add(ev.Reply.Usage)
		}
	case events.StepCompleted:
		f.Steps = append(f.Steps, ev.Step)
		f.Current = Step{}
	case events.RunFinished:
		f.Finished = &ev
	case events.Decision:
		if ev.Verdict.Resolves() {
			f.Current.Resolution = &ev
		} else {
			f.Current.Decision = &ev
		}
	}
}

// Copying reports whether the fold is inside the prefix a fork copied from
// its source: a forked run whose copied steps are not all folded yet.
func (f *Fold) Copying() bool { return f.Fork != nil && len(f.Steps) < f.Fork.Step }

// State is the recovery table's row for the tail.
func (f *Fold) State() State {
	c := &f.Current
	switch {
	case !f.Started:
		return Empty
	case f.Finished != nil:
		return Finished
	case c.Model == nil:
		return BetweenSteps
	case c.Reply == nil && c.Failure == nil:
		return ModelCallUnknown
	case c.Failure != nil:
		return KnownFailure
	case c.Action == nil:
		return ReplyStored
	case c.Resolution != nil:
		return Resolved
	case c.Action.Awaits == events.AwaitsApproval && c.Decision == nil:
		return AwaitingApproval
	case c.Action.Awaits == events.AwaitsApproval && c.Decision.Verdict == events.VerdictRejected:
		return Rejected
	case c.Action.Awaits == events.AwaitsApproval:
		return Approved
	case c.Action.Awaits == events.AwaitsResolution:
		return AwaitingResolution
	}
	return ActionUnknown
}

// InDoubt is the intent whose side effect's outcome is unknown (in
// ModelCallUnknown, ActionUnknown and AwaitingResolution), or nil.
func (f *Fold) InDoubt() *events.Intent {
	switch f.State() {
	case ModelCallUnknown:
		return f.Current.Model
	case ActionUnknown, AwaitingResolution:
		return f.Current.Action
	}
	return nil
}

// Pending is the action intent awaiting a person's decision (in
// AwaitingApproval and AwaitingResolution), or nil.
func (f *Fold) Pending() *events.Intent {
	switch f.State() {
	case AwaitingApproval, AwaitingResolution:
		return f.Current.Action
	}
	return nil
}

// Plan is what Resume does with the tail: PlanFor its state and the
// replay policy of the intent in doubt, except that an action in doubt
// that may not be replayed awaits an operator's finding when the run's
// parameters ask so (AwaitResolution).
func (f *Fold) Plan() Plan {
	policy := events.ReplayNever
	if in := f.InDoubt(); in != nil {
		policy = in.ReplayPolicy
	}
	plan := PlanFor(f.State(), policy)
	if plan == PlanStopUnknown && f.State() == ActionUnknown && f.AwaitResolution {
		return PlanAwaitResolution
	}
	return plan
}

// AwaitResolutionKey is the parameter snapshot's key by which a run asks
// that a never action in doubt await an operator's finding ("true").
const AwaitResolutionKey = "await_resolution"

// Result is the run's recorded result with its steps (shared with the
// fold) and usage put back, and false while the run has not finished.
func (f *Fold) Result() (events.RunResult, bool) {
	if f.Finished == nil {
		return events.RunResult{}, false
	}
	r := f.Finished.Result
	usage := f.Usage
	r.Steps, r.Usage = f.Steps[:len(f.Steps):len(f.Steps)], &usage
	return r, true
}

// PendingCall is an action waiting for a person's decision: the call a
// reviewer approves or rejects (Awaits approval), or whose outcome in
// doubt an operator resolves (Awaits resolution).
type PendingCall struct {
	// Call is the action intent's result id: the call's id in decisions
	// and commands.
	Call   string        `json:"call"`
	Step   int           `json:"step"`
	Awaits events.Awaits `json:"awaits"`
	// Tool is the tool called ("" for an action without a tool call) and
	// Arguments its arguments as JSON text.
	Tool      string `json:"tool,omitempty"`
	Arguments string `json:"arguments,omitempty"`
	// ArgumentsSchema is the tool's parameter schema as JSON text, against
	// which edited arguments are checked.
	ArgumentsSchema string              `json:"arguments_schema,omitempty"`
	ReplayPolicy    events.ReplayPolicy `json:"replay_policy"`
	// Since is when the awaiting intent became durable (zero when not
	// known).
	Since time.Time `json:"since,omitzero"`
}

// PendingCallOf is the pending call an awaiting intent records, durable
// since at.
func PendingCallOf(in events.Intent, at time.Time) PendingCall {
	return PendingCall{Call: in.ResultID, Step: in.CallIndex, Awaits: in.Awaits, Tool: in.ToolName, Arguments: in.Arguments,
		ArgumentsSchema: in.ArgumentsSchema, ReplayPolicy: in.ReplayPolicy, Since: at}
}
