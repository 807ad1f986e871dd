package proptest

import (
	"context"
	"errors"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// DeletingStore is a store with retention: what RunDeleterContract checks.
type DeletingStore interface {
	seams.RunStore
	seams.RunReader
	seams.RunDeleter
	seams.RunLocker
}

// RunDeleterContract checks a store's DeleteRun: finished runs go whole
// (stream and index entry) and leave others alone; unfinished ones only
// with force; a run a driver holds never; an unknown run is ErrNoRun; a
// deleted run id can be started again. open must return a new, empty store.
func RunDeleterContract(t *testing.T, open func(t *testing.T) DeletingStore) {
	ctx := context.Background()
	gone := func(t *testing.T, s DeletingStore, run string, want bool) {
		t.Helper()
		stream, err := s.Load(ctx, run)
		if err != nil {
			t.Fatal(err)
		}
		runs, err := s.Runs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		listed := false
		for _, r := range runs {
			listed = listed || r.RunID == run
		}
		if (len(stream) == 0) != want || listed == want {
			t.Fatalf("run %q: %d events, listed %v; want gone=%v", run, len(stream), listed, want)
		}
	}
	t.Run("AFinishedRunGoesWholeAndOthersStay", func(t *testing.T) {
		s := open(t)
		AppendEach(t, s, "old", SoundStream("old"))
		AppendEach(t, s, "other", SoundStream("other"))
		if err := s.DeleteRun(ctx, "old", false); err != nil {
			t.Fatal(err)
		}
		gone(t, s, "old", true)
		gone(t, s, "other", false)
		AppendEach(t, s, "old", SoundStream("old")[:2]) // the id is free again
		gone(t, s, "old", false)
	})
	t.Run("AnUnfinishedRunOnlyWithForce", func(t *testing.T) {
		s := open(t)
		AppendEach(t, s, "live", SoundStream("live")[:3])
		if err := s.DeleteRun(ctx, "live", false); !errors.Is(err, seams.ErrRunNotFinished) {
			t.Fatalf("delete of an unfinished run: %v", err)
		}
		gone(t, s, "live", false)
		if err := s.DeleteRun(ctx, "live", true); err != nil {
			t.Fatal(err)
		}
		gone(t, s, "live", true)
	})
	t.Run("ARunADriverHoldsIsRefused", func(t *testing.T) {
		s := open(t)
		AppendEach(t, s, "driven", SoundStream("driven"))
		release, err := s.LockRun("driven")
		if err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteRun(ctx, "driven", true); !errors.Is(err, seams.ErrRunLocked) {
			t.Fatalf("delete of a driven run: %v", err)
		}
		gone(t, s, "driven", false)
		release()
		if err := s.DeleteRun(ctx, "driven", false); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("AnUnknownRunIsErrNoRun", func(t *testing.T) {
		s := open(t)
		if err := s.DeleteRun(ctx, "ghost", true); !errors.Is(err, seams.ErrNoRun) {
			t.Fatalf("delete of an unknown run: %v", err)
		}
	})
}

// AppendEach appends evs to run one at a time, each after the last, as a
// driver would; it fails t on any error.
func AppendEach(t testing.TB, s seams.RunStore, run string, evs []events.Event) {
	t.Helper()
	var tail ulid.ULID
	for _, ev := range evs {
		envs, err := s.Append(context.Background(), run, tail, ev)
		if err != nil {
			t.Fatal(err)
		}
		tail = envs[0].ID
	}
}
