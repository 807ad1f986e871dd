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
