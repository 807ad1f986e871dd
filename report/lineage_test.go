package report_test

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/report"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// forkAt forks source at step k onto id through the store's ForkRun, as
// engine.Fork copies (the readers' tests do not drive the engine): the
// source's events up to the end of step k-1, after a RunStarted naming
// origin.
func forkAt(t *testing.T, mem *seamstest.MemStore, id string, origin events.ForkOrigin) {
	t.Helper()
	ctx := context.Background()
	stream, err := mem.Load(ctx, origin.Run)
	if err != nil {
		t.Fatal(err)
	}
	var through ulid.ULID
	n, completed := 0, 0
	for i, env := range stream[1:] {
		if completed == origin.Step {
			break
		}
		through, n = env.ID, i+1
		if env.Kind == events.KindStepCompleted {
			completed++
		}
	}
	if n > 0 {
		origin.LastKey = through.String()
	}
	started := events.RunStarted{RunID: id, SchemaVersion: events.CurrentSchemaVersion, Fork: &origin,
		ParameterSnapshot: stream[0].Event.(events.RunStarted).ParameterSnapshot}
	if _, err := mem.ForkRun(ctx, id, started, origin.Run, through, n); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond) // listings are newest first
}

// lineageStore holds a finished source whose step 0 executed a never
// action, forks of it at steps 0 and 2 (with a parameter difference), and
// a fork at step 1 of the fork at 2.
func lineageStore(t *testing.T) *seamstest.MemStore {
	mem := &seamstest.MemStore{}
	proptest.AppendEach(t, mem, "src", proptest.SoundStream("src"))
	time.Sleep(2 * time.Millisecond)
	forkAt(t, mem, "f0", events.ForkOrigin{Run: "src", Step: 0})
	forkAt(t, mem, "f2", events.ForkOrigin{Run: "src", Step: 2, Differences: []string{`model.name: "scripted" at start, now "other"`}})
	forkAt(t, mem, "ff", events.ForkOrigin{Run: "f2", Step: 1, Ancestry: []events.Ancestor{{Run: "src", Steps: 1}}})
	return mem
}

// TestNeverActionsFromCountsWhatAForkDoesNotSee: the never actions a
// source executed at a step and after, one row per rule.
func TestNeverActionsFromCountsWhatAForkDoesNotSee(t *testing.T) {
	sound := proptest.SoundStream("r") // step 0 executes a never action
	safe := proptest.SoundStream("r")
	in := safe[3].(events.Intent)
	in.ReplayPolicy = events.ReplaySafe
	safe[3] = in
	notRun := proptest.SoundStream("r")
	sc := notRun[4].(events.StepCompleted)
	sc.Step.ActionStatus = new(events.StatusNotExecuted)
	notRun[4] = sc
	for _, c := range []struct {
		name   string
		stream []events.Event
		step   int
		want   int
	}{
		{"an executed never action at the step counts", sound, 0, 1},
		{"one before the step does not", sound, 1, 0},
		{"past the last step, none", sound, 4, 0},
		{"a safe action does not count", safe, 0, 0},
		{"a never action not executed does not count", notRun, 0, 0},
		{"a never action in doubt counts: it may have happened", sound[:4], 0, 1},
		{"a never action in doubt before the step does not", sound[:4], 1, 0},
	} {
		mem := &seamstest.MemStore{}
		proptest.AppendEach(t, mem, "r", c.stream)
		stream, err := mem.Load(context.Background(), "r")
		if err != nil {
			t.Fatal(err)
		}
		if got := report.NeverActionsFrom(stream, c.step); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}

// TestListShowsEachRunsLineage: a listing says of each fork where it came
// from (with the differences) and what its source executed unseen, and of
// each source its forks, oldest first; a run that is no fork has none.
func TestListShowsEachRunsLineage(t *testing.T) {
	mem := lineageStore(t)
	runs, err := report.List(context.Background(), mem)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]report.Lineage{}
	for _, r := range runs {
		if r.Status == seams.StatusCorrupt {
			t.Fatalf("%s is corrupt: %v", r.Info.RunID, r.Err)
		}
		got[r.Info.RunID] = r.Lineage
	}
	one, zero := 1, 0
	want := map[string]struct {
		from   string
		step   int
		unseen *int
		forks  []report.Fork
	}{
		"src": {forks: []report.Fork{{Run: "f0", Step: 0}, {Run: "f2", Step: 2}}},
		"f0":  {from: "src", step: 0, unseen: &one},
		"f2":  {from: "src", step: 2, unseen: &zero, forks: []report.Fork{{Run: "ff", Step: 1}}},
		"ff":  {from: "f2", step: 1, unseen: &zero},
	}
	for id, w := range want {
		l := got[id]
		if (l.ForkedFrom == nil) != (w.from == "") || l.ForkedFrom != nil && (l.ForkedFrom.Run != w.from || l.ForkedFrom.Step != w.step) {
			t.Errorf("%s forked from %+v, want %q at %d", id, l.ForkedFrom, w.from, w.step)
		}
		if !reflect.DeepEqual(l.SourceNeverActions, w.unseen) || !reflect.DeepEqual(l.Forks, w.forks) {
			t.Errorf("%s: unseen %v forks %v, want %v %v", id, l.SourceNeverActions, l.Forks, w.unseen, w.forks)
		}
	}
	if d := got["f2"].ForkedFrom.Differences; len(d) != 1 || !strings.Contains(d[0], "model.name") {
		t.Errorf("f2's differences %q", d)
	}
}

// TestTraceOfOneRunIsTheListingsLineage: a reader of one run (FindForks
// over the index, then Trace) finds the lineage a listing gives.
func TestTraceOfOneRunIsTheListingsLineage(t *testing.T) {
	mem := lineageStore(t)
	ctx := context.Background()
	runs, err := report.List(ctx, mem)
	if err != nil {
		t.Fatal(err)
	}
	infos, err := mem.Runs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	forks, err := report.FindForks(ctx, mem, infos)
	if err != nil {
		t.Fatal(err)
	}
	for _, listed := range runs {
		stream, err := mem.Load(ctx, listed.Info.RunID)
		r := report.Classify(listed.Info, stream, err)
		report.Trace(ctx, mem, &r, forks)
		if !reflect.DeepEqual(r.Lineage, listed.Lineage) {
			t.Errorf("%s: traced %+v, listed %+v", listed.Info.RunID, r.Lineage, listed.Lineage)
		}
	}
	// A source deleted since: the fork still says where it came from,
	// and no count of what it cannot read.
	if err := mem.DeleteRun(ctx, "src", true); err != nil {
		t.Fatal(err)
	}
	stream, err := mem.Load(ctx, "f0")
	r := report.Classify(seams.RunInfo{RunID: "f0"}, stream, err)
	report.Trace(ctx, mem, &r, forks)
	if r.Lineage.ForkedFrom == nil || r.Lineage.ForkedFrom.Run != "src" || r.Lineage.SourceNeverActions != nil {
		t.Errorf("fork of a deleted source: %+v", r.Lineage)
	}
}

// TestLineageInWords: how readers word an origin, its copied steps and
// the never actions a fork does not see.
func TestLineageInWords(t *testing.T) {
	id := func(s string) string { return "<" + s + ">" }
	two, zero := 2, 0
	for _, c := range []struct {
		o                     events.ForkOrigin
		unseen                *int
		origin, copied, words string
	}{
		{events.ForkOrigin{Run: "a", Step: 0}, &two, "forked from <a> at step 0", "no step is copied",
			"the source executed 2 never actions at step 0 and after (not seen by this fork)"},
		{events.ForkOrigin{Run: "a", Step: 1}, &zero, "forked from <a> at step 1", "step 0 is copied from <a>", ""},
		{events.ForkOrigin{Run: "a", Step: 3}, nil, "forked from <a> at step 3", "steps 0–2 are copied from <a>", ""},
		{events.ForkOrigin{Run: "b", Step: 4, Ancestry: []events.Ancestor{{Run: "r", Steps: 1}, {Run: "a", Steps: 3}}}, &two,
			"forked from <b> at step 4 (step 0 first ran in <r>, steps 1–2 in <a>)", "steps 0–3 are copied from <b>",
			"the source executed 2 never actions at step 4 and after (not seen by this fork)"},
	} {
		l := report.Lineage{ForkedFrom: &c.o, SourceNeverActions: c.unseen}
		if got := report.Origin(c.o, id); got != c.origin {
			t.Errorf("Origin %+v = %q, want %q", c.o, got, c.origin)
		}
		if got := report.Copied(c.o, id); got != c.copied {
			t.Errorf("Copied %+v = %q, want %q", c.o, got, c.copied)
		}
		if got := l.Unseen(); got != c.words {
			t.Errorf("Unseen %+v = %q, want %q", c.o, got, c.words)
		}
	}
	if got := (report.Lineage{SourceNeverActions: &two}).Unseen(); got != "" {
		t.Errorf("a run that is no fork: %q", got)
	}
}
