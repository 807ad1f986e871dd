package crashstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/crashstore"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// TestTheStoreCrashesAfterItsAppends: After appends reach the inner store;
// that one and every later one fail with ErrCrashed and write nothing;
// Load and Parameters are the inner store's throughout.
func TestTheStoreCrashesAfterItsAppends(t *testing.T) {
	evs := proptest.SoundStream("r")
	for _, c := range []struct {
		name  string
		after int
		want  int // appends that reach the inner store
	}{
		{"a negative limit never crashes", -1, len(evs)},
		{"zero crashes at the first append", 0, 0},
		{"two appends, then the crash", 2, 2},
		{"a limit past the run never crashes", len(evs) + 1, len(evs)},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			inner := &seamstest.MemStore{}
			s := &crashstore.Store{Inner: inner, After: c.after}
			var tail ulid.ULID
			for i, ev := range evs {
				envs, err := s.Append(ctx, "r", tail, ev)
				if crashed := i >= c.want; crashed != errors.Is(err, crashstore.ErrCrashed) || !crashed && err != nil {
					t.Fatalf("append %d: %v", i, err)
				}
				if err == nil {
					tail = envs[len(envs)-1].ID
				}
			}
			stream, err := s.Load(ctx, "r")
			if err != nil || len(stream) != c.want {
				t.Fatalf("Load: %d events (%v), want %d", len(stream), err, c.want)
			}
			if s.Parameters()["kind"] != inner.Parameters()["kind"] {
				t.Fatalf("Parameters %v, the inner store's %v", s.Parameters(), inner.Parameters())
			}
		})
	}
}

// TestTheStoreHoldsTheInnerStoresLocks: a run locked through the Store is
// locked in the inner store; over a store without locks, LockRun succeeds.
func TestTheStoreHoldsTheInnerStoresLocks(t *testing.T) {
	inner := &seamstest.MemStore{}
	unlock, err := (&crashstore.Store{Inner: inner}).LockRun("r")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inner.LockRun("r"); !errors.Is(err, seams.ErrRunLocked) {
		t.Fatalf("the inner store's lock: %v, want ErrRunLocked", err)
	}
	unlock()
	unlock, err = (&crashstore.Store{Inner: noLocks{inner}}).LockRun("r")
	if err != nil {
		t.Fatal(err)
	}
	unlock()
}

// noLocks hides its store's RunLocker.
type noLocks struct{ seams.RunStore }
