package projections_test

import (
	"reflect"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/projections"
	"github.com/polyloop/polyloop/proptest"
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
