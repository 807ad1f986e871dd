package engine_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/oklog/ulid/v2"
	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// sourceReplies is a run of four steps: three actions, then an answer.
var sourceReplies = []string{"ACTION: ls", "ACTION: wc -l", "ACTION: du", "FINAL: 42 files"}

// trajectory is a run's steps with their wall times zeroed (the only
// field a clock decides).
func trajectory(t *testing.T, store seams.RunStore, runID string) []events.StepRecord {
	t.Helper()
	v, err := recovery.Classify(runID, soundLog(t, store, runID))
	if err != nil {
		t.Fatal(err)
	}
	steps := v.Steps()
	for i := range steps {
		steps[i].StepWallMs = 0
	}
	return steps
}

// TestAForkAtEveryStepFedTheSameRepliesRetracesItsSource: for every k
// of a finished run, a fork at k fed the source's replies after k has the
// source's trajectory, executes only the actions after k (the copied ones
// are history), and records where it came from.
func TestAForkAtEveryStepFedTheSameRepliesRetracesItsSource(t *testing.T) {
	store := &seamstest.MemStore{}
	src := newAgent(store, "source", seamstest.Replies(sourceReplies...)...)
	src.run(t)
	want := trajectory(t, store, "source")
	for k := 0; k <= len(want); k++ {
		fork := newAgent(store, fmt.Sprintf("fork-%d", k), seamstest.Replies(sourceReplies...)...) // turns by call index
		r, err := engine.Fork(context.Background(), fork.def, fork.req, "source", k)
		if err != nil {
			t.Fatalf("fork at %d: %v", k, err)
		}
		if r.StopReason != events.StopAgentFinished {
			t.Errorf("fork at %d stopped %s", k, r.StopReason)
		}
		if got := trajectory(t, store, fork.req.RunID); !reflect.DeepEqual(got, want) {
			t.Errorf("fork at %d:\n got %+v\nwant %+v", k, got, want)
		}
		if calls, executed := len(fork.model.Calls()), len(fork.exec.Calls()); calls != len(sourceReplies)-k || executed != max(0, 3-k) {
			t.Errorf("fork at %d made %d model calls and %d actions, want %d and %d", k, calls, executed, len(sourceReplies)-k, max(0, 3-k))
		}
		stream := soundLog(t, store, fork.req.RunID)
		origin := stream[0].Event.(events.RunStarted).Fork
		if origin == nil || origin.Run != "source" || origin.Step != k || len(origin.Differences) != 0 {
			t.Errorf("fork at %d records %+v, want source, step %d, no differences", k, origin, k)
		}
	}
}

// TestAForkUnderAnotherModelDivergesOnlyAfterItsStep: fed other replies
// after k, a fork keeps the source's first k steps and differs after;
// its RunStarted lists how its parameters differ.
func TestAForkUnderAnotherModelDivergesOnlyAfterItsStep(t *testing.T) {
	store := &seamstest.MemStore{}
	src := newAgent(store, "source", seamstest.Replies(sourceReplies...)...)
	src.run(t)
	want := trajectory(t, store, "source")
	fork := newAgent(store, "other", seamstest.Replies("-", "-", "FINAL: 7 files")...) // turns by call index
	fork.req.Budget.MaxSteps = 9
	if _, err := engine.Fork(context.Background(), fork.def, fork.req, "source", 2); err != nil {
		t.Fatal(err)
	}
	got := trajectory(t, store, "other")
	if len(got) != 3 || !reflect.DeepEqual(got[:2], want[:2]) || got[2].RawOutput != "FINAL: 7 files" {
		t.Fatalf("fork at 2 under other replies: %+v", got)
	}
	origin := soundLog(t, store, "other")[0].Event.(events.RunStarted).Fork
	if len(origin.Differences) != 1 || origin.Differences[0] != `budget.max_steps: "10" at start, now "9"` {
		t.Fatalf("differences %q, want the step budget's", origin.Differences)
	}
}

// TestAForkOfAForkCopiesTheCopiedPrefix: a fork's prefix may itself be
// copied; the grandchild's log is sound and retraces the source.
func TestAForkOfAForkCopiesTheCopiedPrefix(t *testing.T) {
	store := &seamstest.MemStore{}
	newAgent(store, "source", seamstest.Replies(sourceReplies...)...).run(t)
	want := trajectory(t, store, "source")
	child := newAgent(store, "child", seamstest.Replies(sourceReplies...)...)
	if _, err := engine.Fork(context.Background(), child.def, child.req, "source", 1); err != nil {
		t.Fatal(err)
	}
	grand := newAgent(store, "grandchild", seamstest.Replies(sourceReplies...)...)
	if _, err := engine.Fork(context.Background(), grand.def, grand.req, "child", 3); err != nil {
		t.Fatal(err)
	}
	if got := trajectory(t, store, "grandchild"); !reflect.DeepEqual(got, want) {
		t.Fatalf("grandchild:\n got %+v\nwant %+v", got, want)
	}
	origin := soundLog(t, store, "grandchild")[0].Event.(events.RunStarted).Fork
	if origin.Run != "child" || origin.Step != 3 || !reflect.DeepEqual(origin.Ancestry, []events.Ancestor{{Run: "source", Steps: 1}}) {
		t.Fatalf("grandchild's origin %+v, want child at 3, step 0 source's", origin)
	}
}

// TestForkRefusesWritingNothing: a step beyond the source's end, a source
// with no log or a damaged one, a run id that has a log: typed errors, and
// not one event written.
func TestForkRefusesWritingNothing(t *testing.T) {
	store := &seamstest.MemStore{}
	newAgent(store, "source", seamstest.Replies(sourceReplies...)...).run(t)
	newAgent(store, "damaged", seamstest.Replies(sourceReplies...)...).run(t)
	store.Damage("damaged", 2, func(v []byte) []byte { v[len(v)/2] ^= 0xff; return v })
	for _, c := range []struct {
		name   string
		runID  string
		source string
		step   int
		want   error
	}{
		{"a step beyond the source's end", "f1", "source", 5, engine.ErrForkStep},
		{"a negative step", "f2", "source", -1, engine.ErrInvalidRequest},
		{"a source with no log", "f3", "nope", 0, engine.ErrRunNotFound},
		{"a damaged source", "f4", "damaged", 1, recovery.ErrCorrupt},
		{"onto a run that exists", "source", "damaged", 0, engine.ErrInvalidRequest},
		{"onto another run that exists", "damaged", "source", 1, engine.ErrRunExists},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := store.Transactions()
			a := newAgent(store, c.runID, seamstest.Replies("FINAL: x")...)
			if c.name == "onto a run that exists" {
				c.source = c.runID // a run forked onto itself
			}
			_, err := engine.Fork(context.Background(), a.def, a.req, c.source, c.step)
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			if store.Transactions() != before {
				t.Fatal("a refused fork wrote")
			}
		})
	}
}

// TestAForksSinkHearsItsStart: the definition's sink hears the fork's
// RunStarted — durable like any event — and then the fork's own events,
// not the copied ones.
func TestAForksSinkHearsItsStart(t *testing.T) {
	store := &seamstest.MemStore{}
	newAgent(store, "source", seamstest.Replies(sourceReplies...)...).run(t)
	f := newAgent(store, "fork", seamstest.Replies(sourceReplies...)...)
	sink := &seamstest.Sink{}
	f.def.Events = sink
	if _, err := engine.Fork(context.Background(), f.def, f.req, "source", 2); err != nil {
		t.Fatal(err)
	}
	got := sink.Envelopes()
	if len(got) == 0 || got[0].Kind != events.KindRunStarted || got[0].Event.(events.RunStarted).Fork == nil {
		t.Fatalf("the sink heard first %v, want the fork's run_started", got)
	}
	for _, env := range got {
		if id := events.RunIDOf(env.Event); id != "fork" {
			t.Fatalf("the sink heard a copied event of %q", id)
		}
	}
}

// TestASourceWrittenBeforeChecksumsForks: values a schema 1.0 writer
// stored carry no checksum and are copied as they are; every step of such
// a source forks into a sound log.
func TestASourceWrittenBeforeChecksumsForks(t *testing.T) {
	ctx := context.Background()
	files, _ := filepath.Glob("../events/testdata/wire-1.0/*.msgpack")
	if len(files) < 11 {
		t.Fatalf("%d 1.0 golden values", len(files))
	}
	var evs []events.Event
	var raw [][]byte
	for _, f := range files[:11] { // three steps, the run unfinished
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		env, err := events.Unmarshal("run-1", ulid.ULID{}, b)
		if err != nil {
			t.Fatal(err)
		}
		evs, raw = append(evs, env.Event), append(raw, b)
	}
	store := &seamstest.MemStore{}
	if _, err := store.Append(ctx, "run-1", ulid.ULID{}, evs...); err != nil {
		t.Fatal(err)
	}
	for i, b := range raw {
		store.Damage("run-1", i, func([]byte) []byte { return b }) // as the 1.0 writer stored it
	}
	v, err := recovery.Classify("run-1", soundLog(t, store, "run-1"))
	if err != nil || len(v.Steps()) != 3 {
		t.Fatalf("the 1.0 source: %d steps, %v", len(v.Steps()), err)
	}
	for k := 0; k <= 3; k++ {
		f := newAgent(store, fmt.Sprintf("f%d", k), seamstest.Replies("-", "-", "-", "FINAL: x")...)
		if _, err := engine.Fork(ctx, f.def, f.req, "run-1", k); err != nil {
			t.Fatalf("fork at %d: %v", k, err)
		}
		soundLog(t, store, f.req.RunID)
	}
}
