package engine_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

func TestResumeWithoutALogIsRunNotFound(t *testing.T) {
	store := openKV(t)
	a := newAgent(store, "ghost", seamstest.Replies("FINAL: x")...)
	if _, err := engine.Resume(context.Background(), a.def, a.req); !errors.Is(err, engine.ErrRunNotFound) {
		t.Fatalf("got %v, want ErrRunNotFound", err)
	}
	if store.Transactions() != 0 {
		t.Fatal("Resume of an unknown run wrote")
	}
}

func TestResumeOfAFinishedRunReturnsItsResultAndWritesNothing(t *testing.T) {
	store := openKV(t)
	a := newAgent(store, "done", seamstest.Replies("ACTION: ls", "FINAL: 3")...)
	want := a.run(t)
	before := store.Transactions()
	got, err := engine.Resume(context.Background(), a.def, a.req)
	if err != nil {
		t.Fatal(err)
	}
	if store.Transactions() != before || len(a.model.Calls()) != 2 {
		t.Fatal("Resume of a finished run wrote or called the model")
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("recorded result differs:\n got %+v\nwant %+v", got, want)
	}
}

// TestResumeRefusesChangedParameters lists every differing key, both values.
func TestResumeRefusesChangedParameters(t *testing.T) {
	store := openKV(t)
	a := newAgent(store, "p", seamstest.Replies("ACTION: a", "FINAL: b")...)
	a.def.Store = &proptest.CrashingStore{Inner: store, After: 1}
	if _, err := engine.Run(context.Background(), a.def, a.req); !errors.Is(err, proptest.ErrCrashed) {
		t.Fatal(err)
	}
	a.def.Store = store
	a.req.Budget.MaxSteps = 99
	a.req.ModelReplayPolicy = events.ReplayNever
	a.req.ModelBinding = map[string]string{"temperature": "0.2"}
	before := store.Transactions()
	_, err := engine.Resume(context.Background(), a.def, a.req)
	if !errors.Is(err, engine.ErrParametersChanged) {
		t.Fatalf("got %v, want ErrParametersChanged", err)
	}
	for _, want := range []string{
		`budget.max_steps: "10" at start, now "99"`,
		`model_replay_policy: "safe" at start, now "never"`,
		`binding.temperature: absent at start, now "0.2"`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not list %s:\n%v", want, err)
		}
	}
	if store.Transactions() != before {
		t.Fatal("refused Resume wrote")
	}
}

// TestResumeRefusesACorruptLog: a log that breaks a structural rule is
// refused as corrupt, read as the store scans it or loaded whole — before
// its parameters are compared (they differ here too).
func TestResumeRefusesACorruptLog(t *testing.T) {
	for _, scan := range []bool{true, false} {
		store := openKV(t)
		failure := "x"
		if _, err := store.Append(context.Background(), "bad", ulid.ULID{},
			proptest.SoundStream("bad")[0],
			events.ModelCallResult{RunID: "bad", ResultID: "orphan", Failure: &failure}); err != nil {
			t.Fatal(err)
		}
		a := newAgent(store, "bad")
		if !scan {
			a.def.Store = loadOnly{store}
		}
		if _, err := engine.Resume(context.Background(), a.def, a.req); !errors.Is(err, recovery.ErrCorrupt) {
			t.Fatalf("scan %t: got %v, want ErrCorrupt", scan, err)
		}
	}
}

// TestResumedRunSendsTheSameMessages: crash at every transaction of a run,
// resume, and compare every model call with the uninterrupted run's.
func TestResumedRunSendsTheSameMessages(t *testing.T) {
	// A safe tool and a safe model policy: every crash point can continue.
	turns := seamstest.Replies(`TOOL count {"dir":"a"}`, "oops", `TOOL count {"dir":"b"}`, "FINAL: done")
	reg := toolRegistry(t)
	ref := newAgent(&seamstest.MemStore{}, "m", turns...)
	ref.req.Tools, ref.req.Executor = reg, reg.Executor()
	want := ref.run(t)
	refCalls := ref.model.Calls()
	total := ref.def.Store.(*seamstest.MemStore).Transactions()
	for crash := 1; crash < int(total); crash++ {
		store := &seamstest.MemStore{}
		a := newAgent(store, "m", turns...)
		a.req.Tools, a.req.Executor = reg, reg.Executor()
		a.def.Store = &proptest.CrashingStore{Inner: store, After: crash}
		if _, err := engine.Run(context.Background(), a.def, a.req); !errors.Is(err, proptest.ErrCrashed) {
			t.Fatalf("crash %d: %v", crash, err)
		}
		a.def.Store = store
		got, err := engine.Resume(context.Background(), a.def, a.req)
		if err != nil {
			t.Fatalf("crash %d: %v", crash, err)
		}
		if got.StopReason != want.StopReason || !proptest.SameSteps(got.Steps, want.Steps) {
			t.Fatalf("crash %d: resumed to %s/%d steps, want %s/%d", crash, got.StopReason, len(got.Steps), want.StopReason, len(want.Steps))
		}
		for _, c := range a.model.Calls() {
			if !reflect.DeepEqual(c.Messages, refCalls[c.CallIndex].Messages) {
				t.Fatalf("crash %d: call %d sent other messages than the uninterrupted run", crash, c.CallIndex)
			}
		}
	}
}

// loadOnly hides a store's Scan, so Resume reads the stream with Load.
type loadOnly struct{ seams.RunStore }

// TestResumeReadsAStreamAsItScansIt: Resume replays a store's stream as
// it scans it (seams.RunScanner), holding no copy; crashed at every
// transaction, it resumes exactly as when it loads the whole stream first —
// the same result, the same messages to the model, the same events written.
func TestResumeReadsAStreamAsItScansIt(t *testing.T) {
	turns := seamstest.Replies(`TOOL count {"dir":"a"}`, "oops", `TOOL count {"dir":"b"}`, "FINAL: done")
	reg := toolRegistry(t)
	for crash := 1; ; crash++ {
		var results []events.RunResult
		var calls [][]seams.ModelCall
		var streams [][]events.Kind
		for _, scan := range []bool{true, false} {
			store := openKV(t)
			a := newAgent(store, "m", turns...)
			a.req.Tools, a.req.Executor = reg, reg.Executor()
			a.def.Store = &proptest.CrashingStore{Inner: store, After: crash}
			if _, err := engine.Run(context.Background(), a.def, a.req); !errors.Is(err, proptest.ErrCrashed) {
				if err == nil && !scan {
					t.Fatal("the uncrashed run")
				}
				if err == nil {
					if crash < 4 {
						t.Fatalf("the run finished before crash point %d", crash)
					}
					return // every crash point done
				}
				t.Fatalf("crash %d: %v", crash, err)
			}
			a.def.Store = store
			if !scan {
				a.def.Store = loadOnly{store}
			}
			got, err := engine.Resume(context.Background(), a.def, a.req)
			if err != nil {
				t.Fatalf("crash %d (scan %t): %v", crash, scan, err)
			}
			stream, err := store.Load(context.Background(), "m")
			if err != nil {
				t.Fatal(err)
			}
			var kinds []events.Kind
			for _, env := range stream {
				kinds = append(kinds, env.Kind)
			}
			results, calls, streams = append(results, got), append(calls, a.model.Calls()), append(streams, kinds)
		}
		if results[0].StopReason != results[1].StopReason || !proptest.SameSteps(results[0].Steps, results[1].Steps) {
			t.Fatalf("crash %d: scanned %s/%d steps, loaded %s/%d", crash, results[0].StopReason, len(results[0].Steps), results[1].StopReason, len(results[1].Steps))
		}
		if len(calls[0]) != len(calls[1]) || !reflect.DeepEqual(streams[0], streams[1]) {
			t.Fatalf("crash %d: %d model calls and %v scanned, %d and %v loaded", crash, len(calls[0]), streams[0], len(calls[1]), streams[1])
		}
		for i := range calls[0] {
			if !reflect.DeepEqual(calls[0][i].Messages, calls[1][i].Messages) {
				t.Fatalf("crash %d: call %d sent other messages when scanned", crash, i)
			}
		}
	}
}
