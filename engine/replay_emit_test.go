package engine_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// ctxSink records, per envelope, what its Emit context carried.
type ctxSink struct {
	mu     sync.Mutex
	got    []emitted
	caller any // the value callerKey holds in Run's or Resume's context
}

type emitted struct {
	env    events.Envelope
	replay *seams.Replay
	caller any
}

type callerKey struct{}

func (s *ctxSink) Emit(ctx context.Context, env events.Envelope) error {
	e := emitted{env: env, caller: ctx.Value(callerKey{})}
	if r, ok := seams.ReplayOf(ctx); ok {
		e.replay = &r
	}
	s.mu.Lock()
	s.got = append(s.got, e)
	s.mu.Unlock()
	return nil
}

func (s *ctxSink) Parameters() map[string]string { return nil }

// TestEmitsCarryTheCallersValuesAndTheReplay: every Emit gets the values
// of the context the run is driven in; after a crash at any write, the
// resume's emits carry a seams.Replay exactly when the log's tail was an
// intent of a safe policy without its result (the resume makes that model
// call or action again), naming that intent's result id and a time after
// the crash.
func TestEmitsCarryTheCallersValuesAndTheReplay(t *testing.T) {
	count, err := seams.NewRegistry(seams.Tool{Spec: seams.ToolSpec{Name: "count", ReplayPolicy: events.ReplaySafe},
		Handler: func(context.Context, map[string]any) (string, error) { return "3 files", nil }})
	if err != nil {
		t.Fatal(err)
	}
	replays := map[events.IntentKind]int{}
	for crash := 1; ; crash++ {
		store := &seamstest.MemStore{}
		turns := seamstest.Replies(`TOOL count {"dir":"a"}`, `TOOL count {"dir":"b"}`, "FINAL: done")
		newAgent := func(store seams.RunStore) *agent {
			a := newAgent(store, "replays", turns...)
			a.req.Tools, a.req.Executor = count, count.Executor()
			return a
		}
		a := newAgent(&proptest.CrashingStore{Inner: store, After: crash})
		first := &ctxSink{}
		a.def.Events = first
		_, err := engine.Run(context.WithValue(context.Background(), callerKey{}, "run"), a.def, a.req)
		if err == nil {
			break
		}
		if !errors.Is(err, proptest.ErrCrashed) {
			t.Fatalf("crash %d: %v", crash, err)
		}
		for _, e := range first.got {
			if e.replay != nil || e.caller != "run" {
				t.Fatalf("crash %d: Run emitted %s with replay %+v, caller value %v", crash, e.env.Kind, e.replay, e.caller)
			}
		}
		stream, _ := store.Load(context.Background(), "replays")
		want := ""
		if in, ok := stream[len(stream)-1].Event.(events.Intent); ok && in.Awaits == "" && in.ReplayPolicy == events.ReplaySafe {
			want = in.ResultID
			replays[in.IntentKind]++
		}
		crashed := time.Now()
		a = newAgent(store)
		second := &ctxSink{}
		a.def.Events = second
		if _, err := engine.Resume(context.WithValue(context.Background(), callerKey{}, "resume"), a.def, a.req); err != nil {
			t.Fatalf("crash %d: resume: %v", crash, err)
		}
		for _, e := range second.got {
			switch {
			case e.caller != "resume":
				t.Fatalf("crash %d: Resume emitted %s with caller value %v", crash, e.env.Kind, e.caller)
			case want == "" && e.replay != nil:
				t.Fatalf("crash %d: nothing was made again, yet %s carries replay %+v", crash, e.env.Kind, e.replay)
			case want != "" && (e.replay == nil || e.replay.ResultID != want || e.replay.At.Before(crashed)):
				t.Fatalf("crash %d: %s carries replay %+v, want result id %s after %v", crash, e.env.Kind, e.replay, want, crashed)
			}
		}
	}
	if replays[events.IntentModelCall] < 3 || replays[events.IntentAction] < 2 {
		t.Fatalf("crash points leaving an intent to replay, by kind: %v", replays)
	}
	t.Logf("crash points leaving an intent to replay, by kind: %v", replays)
}
