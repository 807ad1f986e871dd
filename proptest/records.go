package proptest

import "github.com/polyloop/polyloop/events"

func ptr[T any](v T) *T { return &v }

// SoundStream returns a finished, structurally sound stream for runID that
// holds every record kind and every shape a record can take: a model reply
// with and without call id and thinking, a model failure, an executed action,
// a rejected tool call, a parse failure, and a final answer. Codec golden
// files and store contract suites use it to round-trip each record.
func SoundStream(runID string) []events.Event {
	v := events.CurrentSchemaVersion
	return []events.Event{
		events.RunStarted{RunID: runID, SchemaVersion: v, ParameterSnapshot: map[string]string{
			"budget.max_steps": "8", "model.name": "scripted", "parser.kind": "fenced",
		}},
		// step 0: tool call executed.
		events.Intent{RunID: runID, IntentKind: events.IntentModelCall, CallIndex: 0, ResultID: "r0m", ReplayPolicy: events.ReplaySafe},
		events.ModelCallResult{RunID: runID, ResultID: "r0m", Reply: &events.ModelReply{CallID: "call-0", Content: "look ✓", Thinking: "hmm"}},
		events.Intent{RunID: runID, IntentKind: events.IntentAction, CallIndex: 0, ResultID: "r0a", ReplayPolicy: events.ReplayNever, ToolName: "list"},
		events.StepCompleted{RunID: runID, ResultID: "r0a",
			ActionOutcome: &events.ActionOutcome{Status: events.StatusExecuted, Observation: "42 files", ObservationTruncatedChars: 3},
			Step: events.StepRecord{StepIdx: 0, RawOutput: "look ✓", ContentChars: 6, ThinkingChars: 3, Action: ptr("ls"), ParseOK: true,
				Observation: "Observation: 42 files", ObservationTruncatedChars: 3, PromptChars: 120, CallID: ptr("call-0"), StepWallMs: 12,
				ToolName: ptr("list"), ToolArguments: ptr(`{"dir":"."}`), ActionStatus: ptr(events.StatusExecuted), SchemaVersion: v}},
		// step 1: rejected tool call, no call id.
		events.Intent{RunID: runID, IntentKind: events.IntentModelCall, CallIndex: 1, ResultID: "r1m", ReplayPolicy: events.ReplaySafe},
		events.ModelCallResult{RunID: runID, ResultID: "r1m", Reply: &events.ModelReply{Content: "call nope"}},
		events.StepCompleted{RunID: runID,
			ActionOutcome: &events.ActionOutcome{Status: events.StatusNotExecuted, Observation: "rejected", ObservationIsSynthetic: true},
			Step: events.StepRecord{StepIdx: 1, RawOutput: "call nope", ContentChars: 9, Action: ptr("nope"), ParseOK: true,
				Observation: "rejected", ObservationIsSynthetic: true, PromptChars: 150,
				ToolName: ptr("nope"), ToolArguments: ptr(`{}`), ActionStatus: ptr(events.StatusNotExecuted), SchemaVersion: v}},
		// step 2: parse failure.
		events.Intent{RunID: runID, IntentKind: events.IntentModelCall, CallIndex: 2, ResultID: "r2m", ReplayPolicy: events.ReplaySafe},
		events.ModelCallResult{RunID: runID, ResultID: "r2m", Reply: &events.ModelReply{CallID: "call-2", Content: "???"}},
		events.StepCompleted{RunID: runID,
			Step: events.StepRecord{StepIdx: 2, RawOutput: "???", ContentChars: 3, ParseError: ptr("no action"),
				Observation: "no action", ObservationIsSynthetic: true, PromptChars: 170, CallID: ptr("call-2"), SchemaVersion: v}},
		// step 3: final answer.
		events.Intent{RunID: runID, IntentKind: events.IntentModelCall, CallIndex: 3, ResultID: "r3m", ReplayPolicy: events.ReplaySafe},
		events.ModelCallResult{RunID: runID, ResultID: "r3m", Reply: &events.ModelReply{CallID: "call-3", Content: "done: 42"}},
		events.StepCompleted{RunID: runID,
			Step: events.StepRecord{StepIdx: 3, RawOutput: "done: 42", ContentChars: 8, ParseOK: true, PromptChars: 190,
				CallID: ptr("call-3"), StepWallMs: 5, SchemaVersion: v}},
		events.RunFinished{RunID: runID, Result: events.RunResult{RunID: runID, StopReason: events.StopAgentFinished,
			FinalAnswer: ptr("42"), SchemaVersion: v, EventDeliveryFailures: 1}},
	}
}

// FailedModelCall returns the records of a step whose model call failed,
// followed by the run's end: the other shape ModelCallResult can take.
func FailedModelCall(runID string, step int) []events.Event {
	v := events.CurrentSchemaVersion
	return []events.Event{
		events.Intent{RunID: runID, IntentKind: events.IntentModelCall, CallIndex: step, ResultID: "rfm", ReplayPolicy: events.ReplayNever},
		events.ModelCallResult{RunID: runID, ResultID: "rfm", Failure: ptr("503 upstream")},
		events.StepCompleted{RunID: runID, Step: events.StepRecord{StepIdx: step, Observation: "model call failed",
			ObservationIsSynthetic: true, SchemaVersion: v}},
		events.RunFinished{RunID: runID, Result: events.RunResult{RunID: runID, StopReason: events.StopLLMError, SchemaVersion: v}},
	}
}

// DecidedSteps returns the records of three steps, from index step on,
// that people decided (schema 1.5), without the run's end: an action
// approved with edited arguments (its awaiting intent, the decision, the
// intent that executed it, the step executed with the edited arguments);
// one rejected (the step not executed, the reviewer's note its
// observation); and one a crash left in doubt whose outcome an operator
// found executed (the intent, the one awaiting the finding, the finding,
// the step as found). Appended to a sound stream whose steps before step
// are all completed, it leaves it sound.
func DecidedSteps(runID string, step int) []events.Event {
	v := events.CurrentSchemaVersion
	schema := `{"properties":{"amount":{"maximum":500,"type":"number"}},"required":["amount"],"type":"object"}`
	model := func(i int, id, content string) []events.Event {
		return []events.Event{
			events.Intent{RunID: runID, IntentKind: events.IntentModelCall, CallIndex: step + i, ResultID: id + "m", ReplayPolicy: events.ReplaySafe},
			events.ModelCallResult{RunID: runID, ResultID: id + "m", Reply: &events.ModelReply{Content: content}},
		}
	}
	action := func(i int, id string, awaits events.Awaits, args string) events.Intent {
		in := events.Intent{RunID: runID, IntentKind: events.IntentAction, CallIndex: step + i, ResultID: id, ReplayPolicy: events.ReplayNever,
			ToolName: "refund", Awaits: awaits}
		if awaits != "" {
			in.Arguments, in.ArgumentsSchema = args, schema
		}
		return in
	}
	record := func(i int, content, args string, status events.ActionStatus, obs string, synthetic bool) events.StepRecord {
		return events.StepRecord{StepIdx: step + i, RawOutput: content, ContentChars: len(content), Action: ptr(content), ParseOK: true,
			Observation: obs, ObservationIsSynthetic: synthetic, PromptChars: 300 + 10*i, ToolName: ptr("refund"),
			ToolArguments: ptr(args), ActionStatus: ptr(status), SchemaVersion: v}
	}
	var out []events.Event
	// Approved with edited arguments: 40 became 30.
	approved := `TOOL refund {"amount":40}`
	out = append(out, model(0, "d0", approved)...)
	out = append(out,
		action(0, "d0a", events.AwaitsApproval, `{"amount":40}`),
		events.Decision{RunID: runID, ResultID: "d0a", Verdict: events.VerdictApproved, By: "ana", Note: "only 30 was paid", Arguments: ptr(`{"amount":30}`)},
		action(0, "d0a", "", ""),
		events.StepCompleted{RunID: runID, ResultID: "d0a", ActionOutcome: &events.ActionOutcome{Status: events.StatusExecuted, Observation: "refunded 30"},
			Step: record(0, approved, `{"amount":30}`, events.StatusExecuted, "refunded 30", false)})
	// Rejected.
	rejected := `TOOL refund {"amount":400}`
	out = append(out, model(1, "d1", rejected)...)
	out = append(out,
		action(1, "d1a", events.AwaitsApproval, `{"amount":400}`),
		events.Decision{RunID: runID, ResultID: "d1a", Verdict: events.VerdictRejected, By: "bo", Note: "never paid"},
		events.StepCompleted{RunID: runID, ResultID: "d1a",
			ActionOutcome: &events.ActionOutcome{Status: events.StatusNotExecuted, Observation: "rejected by reviewer: never paid", ObservationIsSynthetic: true},
			Step:          record(1, rejected, `{"amount":400}`, events.StatusNotExecuted, "rejected by reviewer: never paid", true)})
	// In doubt, found executed.
	doubted := `TOOL refund {"amount":5}`
	out = append(out, model(2, "d2", doubted)...)
	out = append(out,
		action(2, "d2a", "", ""),
		action(2, "d2a", events.AwaitsResolution, `{"amount":5}`),
		events.Decision{RunID: runID, ResultID: "d2a", Verdict: events.VerdictExecuted, By: "ops", Observation: ptr("refund r-5 is in the ledger")},
		events.StepCompleted{RunID: runID, ResultID: "d2a",
			ActionOutcome: &events.ActionOutcome{Status: events.StatusExecuted, Observation: "refund r-5 is in the ledger", ObservationIsSynthetic: true},
			Step:          record(2, doubted, `{"amount":5}`, events.StatusExecuted, "refund r-5 is in the ledger", true)})
	return out
}
