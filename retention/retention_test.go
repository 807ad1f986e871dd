package retention_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/retention"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

func agent(store seams.RunStore, runID string, steps int) (engine.Definition, engine.Request) {
	var replies []string
	for i := range steps {
		replies = append(replies, fmt.Sprintf("ACTION: step %d", i))
	}
	return engine.Definition{Model: &seamstest.Model{Turns: seamstest.Replies(append(replies, "FINAL: done")...)},
			Parser: seamstest.Parser{}, Store: store},
		engine.Request{RunID: runID, Executor: &seamstest.Executor{}, ModelReplayPolicy: events.ReplaySafe,
			Budget: engine.Budget{MaxSteps: steps + 2, MaxActions: steps + 2, MaxConsecutiveParseFailures: 2, MaxPromptChars: 1 << 20}}
}

// TestExpireDeletesOnlyOldFinishedRuns: finished runs before the cutoff
// go; newer ones, unfinished ones and one a driver holds stay.
func TestExpireDeletesOnlyOldFinishedRuns(t *testing.T) {
	ctx := context.Background()
	store, cutoff, release := agedRuns(t)
	res, err := retention.Expire(ctx, store, cutoff)
	release()
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(res.Deleted) != "[old-1 old-2]" || fmt.Sprint(res.Busy) != "[held]" {
		t.Fatalf("deleted %v, busy %v", res.Deleted, res.Busy)
	}
	runs, _ := store.Runs(ctx)
	var left []string
	for _, r := range runs {
		left = append(left, r.RunID)
	}
	if fmt.Sprint(left) != "[held new unfinished]" {
		t.Fatalf("left %v", left)
	}
}

// TestAgentsKeepRunningDuringDeletion: while passes of Expire delete
// finished runs, other agents run on the same store to the end, each log
// sound, and no run is deleted before it finished.
func TestAgentsKeepRunningDuringDeletion(t *testing.T) {
	ctx := context.Background()
	store, err := kv.Open(filepath.Join(t.TempDir(), "s.db"), kv.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	const agents, steps = 8, 30
	var wg sync.WaitGroup
	errs := make(chan error, agents)
	for i := range agents {
		wg.Go(func() {
			id := fmt.Sprint("agent-", i)
			def, req := agent(store, id, steps)
			r, err := engine.Run(ctx, def, req)
			if err == nil && r.StopReason != events.StopAgentFinished {
				err = fmt.Errorf("%s stopped with %s", id, r.StopReason)
			}
			if err == nil {
				if stream, lerr := store.Load(ctx, id); lerr != nil || (len(stream) > 0 && recovery.Check(id, stream) != nil) {
					err = fmt.Errorf("%s: log %v", id, lerr)
				}
			}
			errs <- err
		})
	}
	deleted := 0
	stop := make(chan struct{})
	go func() { wg.Wait(); close(stop) }()
	for pass := 0; ; pass++ {
		res, err := retention.Expire(ctx, store, time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		deleted += len(res.Deleted)
		select {
		case <-stop:
			res, err := retention.Expire(ctx, store, time.Now().Add(time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			deleted += len(res.Deleted)
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			if deleted != agents {
				t.Fatalf("%d runs deleted, want %d (each once it finished)", deleted, agents)
			}
			t.Logf("%d passes of Expire while %d agents ran %d steps each", pass+1, agents, steps)
			return
		default:
		}
	}
}

// damagingStore lists some runs damaged and refuses to delete others as
// unfinished although it lists them finished: what a store does with a
// run whose index entry is damaged or contradicted by its stream.
type damagingStore struct {
	*seamstest.MemStore
	damaged, contradicted string
}

func (s *damagingStore) Runs(ctx context.Context) ([]seams.RunInfo, error) {
	runs, err := s.MemStore.Runs(ctx)
	for i, r := range runs {
		if r.RunID == s.damaged {
			runs[i] = seams.RunInfo{RunID: r.RunID, Status: seams.StatusCorrupt}
		}
	}
	return runs, err
}

func (s *damagingStore) DeleteRun(ctx context.Context, runID string, force bool) error {
	if runID == s.contradicted && !force {
		return fmt.Errorf("delete %q: %w (its stream says so)", runID, seams.ErrRunNotFinished)
	}
	return s.MemStore.DeleteRun(ctx, runID, force)
}

// TestExpireLeavesDamagedRunsAloneAndNamesThem: a run the store lists
// damaged, and one it refuses to delete as unfinished although it listed
// it finished, are neither deleted nor an error that stops the pass: they
// are named in Damaged, and the other old finished runs go.
func TestExpireLeavesDamagedRunsAloneAndNamesThem(t *testing.T) {
	ctx := context.Background()
	store := &damagingStore{MemStore: &seamstest.MemStore{}, damaged: "b", contradicted: "c"}
	for _, id := range []string{"a", "b", "c", "d"} {
		def, req := agent(store, id, 1)
		if _, err := engine.Run(ctx, def, req); err != nil {
			t.Fatal(err)
		}
	}
	res, err := retention.Expire(ctx, store, time.Now().Add(time.Hour))
	if err != nil || fmt.Sprint(res.Deleted) != "[a d]" || fmt.Sprint(res.Damaged) != "[b c]" {
		t.Fatalf("deleted %v, damaged %v (%v); want [a d] deleted, [b c] damaged", res.Deleted, res.Damaged, err)
	}
	if left, _ := store.MemStore.Runs(ctx); len(left) != 2 {
		t.Fatalf("%d runs left, want b and c", len(left))
	}
}

// TestPreviewSaysWhatExpireWouldDo: on a store holding old finished runs,
// a newer one, an unfinished one and one a driver holds, Preview names
// the runs Expire then deletes and holds back, and deletes nothing
// itself.
func TestPreviewSaysWhatExpireWouldDo(t *testing.T) {
	ctx := context.Background()
	store, cutoff, release := agedRuns(t)
	defer release()
	preview, err := retention.Preview(ctx, store, cutoff)
	if err != nil {
		t.Fatal(err)
	}
	if runs, _ := store.Runs(ctx); len(runs) != 5 {
		t.Fatalf("Preview deleted runs: %d left, want 5", len(runs))
	}
	res, err := retention.Expire(ctx, store, cutoff)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(preview) != fmt.Sprint(res) || fmt.Sprint(res.Deleted) != "[old-1 old-2]" || fmt.Sprint(res.Busy) != "[held]" {
		t.Fatalf("Preview %+v, Expire %+v; want both to delete [old-1 old-2] and hold back [held]", preview, res)
	}
}

// TestCheckSaysWhatDeleteRunWould: for each kind of run — finished,
// unfinished, held by a driver, not in the store — with and
// without force, Check's answer is DeleteRun's (nil, or the same
// refusal), and Check deletes nothing.
func TestCheckSaysWhatDeleteRunWould(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		run   string
		force bool
		want  error // nil: deleted
	}{
		{"done", false, nil},
		{"done", true, nil},
		{"unfinished", false, seams.ErrRunNotFinished},
		{"unfinished", true, nil},
		{"held", false, seams.ErrRunLocked},
		{"held", true, seams.ErrRunLocked},
		{"ghost", false, seams.ErrNoRun},
		{"ghost", true, seams.ErrNoRun},
	} {
		t.Run(fmt.Sprintf("%s force=%v", c.run, c.force), func(t *testing.T) {
			store := &seamstest.MemStore{}
			for _, id := range []string{"done", "held"} {
				def, req := agent(store, id, 1)
				if _, err := engine.Run(ctx, def, req); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := store.Append(ctx, "unfinished", [16]byte{}, events.RunStarted{RunID: "unfinished", SchemaVersion: events.CurrentSchemaVersion}); err != nil {
				t.Fatal(err)
			}
			release, err := store.LockRun("held")
			if err != nil {
				t.Fatal(err)
			}
			defer release()
			checked := retention.Check(ctx, store, c.run, c.force)
			if runs, _ := store.Runs(ctx); len(runs) != 3 {
				t.Fatalf("Check deleted: %d runs left, want 3", len(runs))
			}
			deleted := store.DeleteRun(ctx, c.run, c.force)
			for what, err := range map[string]error{"Check": checked, "DeleteRun": deleted} {
				if (c.want == nil) != (err == nil) || c.want != nil && !errors.Is(err, c.want) {
					t.Errorf("%s: %v, want %v", what, err, c.want)
				}
			}
		})
	}
}

// agedRuns is a store holding finished runs old-1, old-2 and held from
// before cutoff, an unfinished run, a finished run new from after it, and
// held reserved as a driver holds it (release gives it back).
func agedRuns(t *testing.T) (store *kv.Store, cutoff time.Time, release func()) {
	t.Helper()
	ctx := context.Background()
	store, err := kv.Open(filepath.Join(t.TempDir(), "s.db"), kv.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	for _, id := range []string{"old-1", "old-2", "held"} {
		def, req := agent(store, id, 1)
		if _, err := engine.Run(ctx, def, req); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.Append(ctx, "unfinished", [16]byte{}, events.RunStarted{RunID: "unfinished", SchemaVersion: events.CurrentSchemaVersion}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	cutoff = time.Now()
	time.Sleep(5 * time.Millisecond)
	def, req := agent(store, "new", 1)
	if _, err := engine.Run(ctx, def, req); err != nil {
		t.Fatal(err)
	}
	release, err = store.LockRun("held")
	if err != nil {
		t.Fatal(err)
	}
	return store, cutoff, release
}
