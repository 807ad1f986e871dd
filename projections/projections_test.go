package projections_test

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/oklog/ulid/v2"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/projections"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
)

// envelopes stamps a stream with increasing ULIDs, one millisecond apart.
func envelopes(evs []events.Event) []events.Envelope {
	var ids events.IDSource
	t0 := time.UnixMilli(1_750_000_000_000)
	out := make([]events.Envelope, len(evs))
	for i, ev := range evs {
		out[i] = events.Envelope{ID: ids.Next(t0.Add(time.Duration(i) * time.Millisecond)), Kind: ev.Kind(),
			SchemaVersion: events.CurrentSchemaVersion, Event: ev}
	}
	return out
}

func TestRunLogOfAFinishedRun(t *testing.T) {
	stream := envelopes(proptest.SoundStream("r"))
	l := projections.Fold(stream)
	if l.Started == nil || l.Finished == nil || len(l.Intents) != 5 || len(l.ModelResults) != 4 || len(l.Steps) != 4 || l.Events != len(stream) {
		t.Fatalf("run log: started=%v finished=%v intents=%d results=%d steps=%d events=%d",
			l.Started != nil, l.Finished != nil, len(l.Intents), len(l.ModelResults), len(l.Steps), l.Events)
	}
	r, ok := l.Result()
	if !ok {
		t.Fatal("finished run has no result")
	}
	if r.StopReason != events.StopAgentFinished || *r.FinalAnswer != "42" || len(r.Steps) != 4 || r.EventDeliveryFailures != 1 {
		t.Errorf("result: %+v", r)
	}
	for i, s := range r.Steps {
		if s.StepIdx != i {
			t.Errorf("step %d has index %d", i, s.StepIdx)
		}
	}
	sum := projections.Summarize(stream)
	want := seams.RunInfo{RunID: "r", Status: seams.StatusFinished, Steps: 4, StopReason: events.StopAgentFinished,
		Events: len(stream), FirstEvent: stream[0].Time(), LastEvent: stream[len(stream)-1].Time(), LastID: stream[len(stream)-1].ID}
	if sum != want {
		t.Errorf("summary\n got %+v\nwant %+v", sum, want)
	}
}

func TestUnfinishedRunHasNoResult(t *testing.T) {
	l := projections.Fold(envelopes(proptest.SoundStream("r")[:6]))
	if _, ok := l.Result(); ok {
		t.Error("unfinished run has a result")
	}
	if tr := l.Trajectory(); tr == nil || len(tr) != 1 {
		t.Errorf("trajectory %v", tr)
	}
	if s := projections.Summarize(envelopes(proptest.SoundStream("r")[:6])); s.Status != seams.StatusRunning || s.StopReason != "" {
		t.Errorf("summary %+v", s)
	}
}

// TestFoldingOneAtATimeEqualsFoldingTheStream: every prefix of a stream, fed
// event by event, gives the view folding that prefix at once gives.
func TestFoldingOneAtATimeEqualsFoldingTheStream(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		all := append(proptest.SoundStream("p")[:13], proptest.FailedModelCall("p", 4)...)
		n := rapid.IntRange(0, len(all)).Draw(t, "prefix")
		stream := envelopes(all[:n])
		var live projections.RunLog
		var sum seams.RunInfo
		for i, env := range stream {
			live.Apply(env)
			if i == 0 {
				sum.RunID = events.RunIDOf(env.Event)
			}
			sum.Apply(env)
		}
		if !reflect.DeepEqual(&live, projections.Fold(stream)) {
			t.Fatalf("RunLog differs after %d events", n)
		}
		if sum != projections.Summarize(stream) {
			t.Fatalf("the index entry differs after %d events", n)
		}
	})
}

// decidedStream is a finished sound stream whose steps 4 to 6 people
// decided (proptest.DecidedSteps).
func decidedStream(t *testing.T) []events.Envelope {
	t.Helper()
	all := append(proptest.SoundStream("r")[:14], proptest.DecidedSteps("r", 4)...)
	stream := envelopes(append(all, proptest.FailedModelCall("r", 7)...))
	if err := recovery.Check("r", stream); err != nil {
		t.Fatalf("the sample stream is not sound: %v", err)
	}
	return stream
}

// TestRunLogListsTheDecisions: a RunLog's Decisions are the Decision
// events with the step each was made in and its envelope's time; the
// trajectory shows what they did to each step — the edited arguments
// that ran, the reviewer's note — in the StepRecord's eighteen fields.
func TestRunLogListsTheDecisions(t *testing.T) {
	stream := decidedStream(t)
	at, id := map[string]time.Time{}, map[string]ulid.ULID{}
	for _, env := range stream {
		if d, ok := env.Event.(events.Decision); ok {
			at[d.ResultID], id[d.ResultID] = env.Time(), env.ID
		}
	}
	l := projections.Fold(stream)
	edited, seen := `{"amount":30}`, "refund r-5 is in the ledger"
	want := []projections.Decision{
		{ID: id["d0a"], Step: 4, Call: "d0a", Verdict: events.VerdictApproved, By: "ana", Note: "only 30 was paid", Arguments: &edited, At: at["d0a"]},
		{ID: id["d1a"], Step: 5, Call: "d1a", Verdict: events.VerdictRejected, By: "bo", Note: "never paid", At: at["d1a"]},
		{ID: id["d2a"], Step: 6, Call: "d2a", Verdict: events.VerdictExecuted, By: "ops", Observation: &seen, At: at["d2a"]},
	}
	if !reflect.DeepEqual(l.Decisions, want) {
		t.Fatalf("decisions\n got %+v\nwant %+v", l.Decisions, want)
	}
	if len(at) != 3 || at["d0a"].IsZero() {
		t.Fatalf("decision times %v", at)
	}
	steps := l.Trajectory()
	if len(steps) != 8 {
		t.Fatalf("%d steps, want 8", len(steps))
	}
	if a := steps[4].ToolArguments; a == nil || *a != edited {
		t.Errorf("step 4's tool_arguments %v, want the edited %s", a, edited)
	}
	if s := steps[5]; *s.ActionStatus != events.StatusNotExecuted || s.Observation != "rejected by reviewer: never paid" {
		t.Errorf("step 5: %s %q", *s.ActionStatus, s.Observation)
	}
	if s := steps[6]; *s.ActionStatus != events.StatusExecuted || !s.ObservationIsSynthetic || s.Observation != seen {
		t.Errorf("step 6: %s synthetic=%t %q", *s.ActionStatus, s.ObservationIsSynthetic, s.Observation)
	}
	// The export's row keeps its eighteen fields.
	b, err := json.Marshal(steps[4])
	if err != nil {
		t.Fatal(err)
	}
	var row map[string]any
	if err := json.Unmarshal(b, &row); err != nil || len(row) != 18 {
		t.Errorf("a step record exports %d fields (%v), want 18", len(row), err)
	}
	// Decisions export with names a reader can rely on.
	b, err = json.Marshal(l.Decisions[0])
	if err != nil {
		t.Fatal(err)
	}
	var dec map[string]any
	json.Unmarshal(b, &dec)
	for _, k := range []string{"step", "call", "verdict", "by", "note", "arguments", "at"} {
		if _, ok := dec[k]; !ok {
			t.Errorf("an exported decision has no %q: %s", k, b)
		}
	}
}

// TestDecisionsFoldOneAtATime: every prefix of a stream with decisions,
// fed event by event, gives the RunLog folding that prefix at once gives.
func TestDecisionsFoldOneAtATime(t *testing.T) {
	stream := decidedStream(t)
	var live projections.RunLog
	for n, env := range stream {
		live.Apply(env)
		if whole := projections.Fold(stream[:n+1]); !reflect.DeepEqual(&live, whole) {
			t.Fatalf("RunLog differs after %d events: %d decisions live, %d folded", n+1, len(live.Decisions), len(whole.Decisions))
		}
	}
	if len(live.Decisions) != 3 {
		t.Fatalf("%d decisions", len(live.Decisions))
	}
}
