package recovery_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
)

// decisionStep is step 0 of a run whose action needs a person: run
// started, model intent, reply, and the action intent awaiting approval.
func decisionStep() []events.Event {
	s := proptest.SoundStream("r")
	awaiting := s[3].(events.Intent)
	awaiting.Awaits, awaiting.Arguments, awaiting.ArgumentsSchema = events.AwaitsApproval, `{"dir":"."}`, `{"type":"object"}`
	return []events.Event{s[0], s[1], s[2], awaiting}
}

// Records a person or a driver adds to decisionStep.
var (
	approved  = events.Decision{RunID: "r", ResultID: "r0a", Verdict: events.VerdictApproved, By: "ana"}
	rejected  = events.Decision{RunID: "r", ResultID: "r0a", Verdict: events.VerdictRejected, By: "ana", Note: "no"}
	executing = events.Intent{RunID: "r", IntentKind: events.IntentAction, CallIndex: 0, ResultID: "r0a", ReplayPolicy: events.ReplayNever, ToolName: "list"}
	doubtful  = events.Intent{RunID: "r", IntentKind: events.IntentAction, CallIndex: 0, ResultID: "r0a", ReplayPolicy: events.ReplayNever, ToolName: "list",
		Awaits: events.AwaitsResolution}
	foundRan  = events.Decision{RunID: "r", ResultID: "r0a", Verdict: events.VerdictExecuted, By: "ops"}
	foundNone = events.Decision{RunID: "r", ResultID: "r0a", Verdict: events.VerdictNotExecuted, By: "ops"}
)

// completed closes step 0 with an outcome of status.
func completed(status events.ActionStatus) events.StepCompleted {
	return events.StepCompleted{RunID: "r", ResultID: "r0a", ActionOutcome: &events.ActionOutcome{Status: status, Observation: "x"},
		Step: events.StepRecord{StepIdx: 0, ParseOK: true, ActionStatus: &status, SchemaVersion: events.CurrentSchemaVersion}}
}

// inDoubt is step 0 with its action intent awaiting nothing: executing
// when the log ends.
func inDoubt() []events.Event { return proptest.SoundStream("r")[:4] }

// awaitingFindings is inDoubt in a run whose parameters ask that an
// action in doubt await an operator's finding.
func awaitingFindings() []events.Event {
	evs := inDoubt()
	started := evs[0].(events.RunStarted)
	started.ParameterSnapshot = map[string]string{recovery.AwaitResolutionKey: "true"}
	evs[0] = started
	return evs
}

func with(base []events.Event, more ...events.Event) []events.Event {
	return append(append([]events.Event{}, base...), more...)
}

// TestTheRowsOfHumanDecisions: each row the decisions add to the
// recovery table — state, plan, status, the call in doubt and the call
// pending.
func TestTheRowsOfHumanDecisions(t *testing.T) {
	for _, c := range []struct {
		name    string
		stream  []events.Event
		state   recovery.State
		plan    recovery.Plan
		status  seams.RunStatus
		doubt   bool // the action's outcome is unknown
		pending events.Awaits
	}{
		{"awaiting approval", decisionStep(), recovery.AwaitingApproval, recovery.PlanAwaitDecision, seams.StatusAwaitingApproval, false, events.AwaitsApproval},
		{"approved", with(decisionStep(), approved), recovery.Approved, recovery.PlanExecuteApproved, seams.StatusRunning, false, ""},
		{"approved, executing", with(decisionStep(), approved, executing), recovery.ActionUnknown, recovery.PlanStopUnknown, seams.StatusInDoubt, true, ""},
		{"rejected", with(decisionStep(), rejected), recovery.Rejected, recovery.PlanCompleteRejected, seams.StatusRunning, false, ""},
		{"in doubt, in a run that awaits findings", awaitingFindings(), recovery.ActionUnknown, recovery.PlanAwaitResolution, seams.StatusInDoubt, true, ""},
		{"in doubt, awaiting a finding", with(inDoubt(), doubtful), recovery.AwaitingResolution, recovery.PlanAwaitDecision, seams.StatusAwaitingResolution, true, events.AwaitsResolution},
		{"in doubt, found executed", with(inDoubt(), foundRan), recovery.Resolved, recovery.PlanCompleteResolved, seams.StatusRunning, false, ""},
		{"awaited, found not executed", with(inDoubt(), doubtful, foundNone), recovery.Resolved, recovery.PlanCompleteResolved, seams.StatusRunning, false, ""},
		{"approved, executing, found executed", with(decisionStep(), approved, executing, foundRan), recovery.Resolved, recovery.PlanCompleteResolved, seams.StatusRunning, false, ""},
		{"rejected and completed", with(decisionStep(), rejected, completed(events.StatusNotExecuted)), recovery.BetweenSteps, recovery.PlanNextStep, seams.StatusRunning, false, ""},
		{"found executed and completed", with(inDoubt(), foundRan, completed(events.StatusExecuted)), recovery.BetweenSteps, recovery.PlanNextStep, seams.StatusRunning, false, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := classify(t, stamp(c.stream))
			if v.State != c.state || v.Plan != c.plan || v.State.Status() != c.status {
				t.Fatalf("state %s plan %s status %s; want %s, %s, %s", v.State, v.Plan, v.State.Status(), c.state, c.plan, c.status)
			}
			if (v.InDoubt != nil) != c.doubt {
				t.Errorf("in doubt: %+v, want %v", v.InDoubt, c.doubt)
			}
			switch {
			case c.pending == "" && v.Pending != nil:
				t.Errorf("pending %+v, want none", v.Pending)
			case c.pending != "" && (v.Pending == nil || v.Pending.Awaits != c.pending || v.Pending.Call != "r0a" || v.Pending.Since.IsZero()):
				t.Errorf("pending %+v, want call r0a awaiting %s since its intent", v.Pending, c.pending)
			}
		})
	}
}

// TestDecisionsNoDriverWritesAreCorrupt: a decision or an intent out of
// its place in the rows is refused with a reason naming it.
func TestDecisionsNoDriverWritesAreCorrupt(t *testing.T) {
	other := approved
	other.ResultID = "elsewhere"
	otherIntent := executing
	otherIntent.ResultID = "elsewhere"
	for _, c := range []struct {
		name   string
		stream []events.Event
		reason string
	}{
		{"a decision before any action intent", with(decisionStep()[:3], approved), "without a pending action intent"},
		{"a decision on another call", with(decisionStep(), other), `decision on "elsewhere"`},
		{"an approval on an action that awaits none", with(inDoubt(), approved), "does not await approval"},
		{"a second answer", with(decisionStep(), approved, rejected), "does not await approval"},
		{"a finding on an action that never ran", with(decisionStep(), foundRan), "is not in doubt"},
		{"a finding after a rejection", with(decisionStep(), rejected, foundNone), "is not in doubt"},
		{"a second finding", with(inDoubt(), foundRan, foundNone), "is not in doubt"},
		{"an executing intent without an approval", with(decisionStep(), executing), "in state awaiting_approval"},
		{"an executing intent after a rejection", with(decisionStep(), rejected, executing), "in state rejected"},
		{"an executing intent of another call", with(decisionStep(), approved, otherIntent), "is not the first's"},
		{"a second executing intent", with(decisionStep(), approved, executing, executing), "in state action_unknown"},
		{"awaiting a finding with nothing in doubt", with(decisionStep()[:3], doubtful), "no action of the step is in doubt"},
		{"completed while awaiting approval", with(decisionStep(), completed(events.StatusNotExecuted)), "awaits a person's decision"},
		{"completed while awaiting a finding", with(inDoubt(), doubtful, completed(events.StatusExecuted)), "awaits a person's decision"},
		{"executed though rejected", with(decisionStep(), rejected, completed(events.StatusExecuted)), "was never executed"},
		{"executed with no executing intent", with(decisionStep(), approved, completed(events.StatusExecuted)), "was never executed"},
		{"completed otherwise than found", with(inDoubt(), foundNone, completed(events.StatusExecuted)), "the operator found it not_executed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := recovery.Check("r", stamp(c.stream))
			var ce *recovery.CorruptError
			if !errors.As(err, &ce) {
				t.Fatalf("got %v, want a *CorruptError", err)
			}
			if !strings.Contains(err.Error(), c.reason) {
				t.Fatalf("reasons %q do not say %q", ce.Reasons, c.reason)
			}
		})
	}
	t.Run("cancelled while awaiting is sound", func(t *testing.T) {
		evs := with(decisionStep(), events.RunFinished{RunID: "r", Result: events.RunResult{RunID: "r", StopReason: events.StopCancelled,
			SchemaVersion: events.CurrentSchemaVersion}})
		if err := recovery.Check("r", stamp(evs)); err != nil {
			t.Fatal(err)
		}
	})
}
