package kv_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// TestKeysStayOrderedAfterTheClockStepsBack: a run's events were written
// by a process whose clock was an hour ahead (its keys are moved an hour
// into the future with bbolt directly). A new Store, with the clock right,
// resumes the run: it continues normally and its keys keep increasing.
func TestKeysStayOrderedAfterTheClockStepsBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runs.db")
	ctx := context.Background()
	agent := func(store seams.RunStore) (engine.Definition, engine.Request) {
		model := &seamstest.Model{Turns: seamstest.Replies("ACTION: one", "ACTION: two", "ACTION: three", "FINAL: done")}
		return engine.Definition{Model: model, Parser: seamstest.Parser{}, Store: store},
			engine.Request{RunID: "r", Executor: &seamstest.Executor{}, ModelReplayPolicy: events.ReplaySafe,
				Budget: engine.Budget{MaxSteps: 10, MaxActions: 10, MaxConsecutiveParseFailures: 2, MaxPromptChars: 100_000}}
	}

	s, err := kv.Open(path, kv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	def, req := agent(&proptest.CrashingStore{Inner: s, After: 3})
	if _, err := engine.Run(ctx, def, req); !errors.Is(err, proptest.ErrCrashed) {
		t.Fatalf("crashing run: %v", err)
	}
	s.Close()

	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	var future ulid.ULID
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("runs")).Bucket([]byte("r"))
		var keys, vals [][]byte
		b.ForEach(func(k, v []byte) error {
			keys, vals = append(keys, append([]byte(nil), k...)), append(vals, append([]byte(nil), v...))
			return nil
		})
		for i, k := range keys {
			id := ulid.ULID(k)
			if err := id.SetTime(id.Time() + uint64(time.Hour.Milliseconds())); err != nil {
				return err
			}
			if err := b.Delete(k); err != nil {
				return err
			}
			if err := b.Put(id[:], vals[i]); err != nil {
				return err
			}
			future = id
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()

	s, err = kv.Open(path, kv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	def, req = agent(s)
	r, err := engine.Resume(ctx, def, req)
	if err != nil {
		t.Fatalf("resume after the clock stepped back: %v", err)
	}
	if r.StopReason != events.StopAgentFinished || len(r.Steps) != 4 {
		t.Fatalf("resumed to %s after %d steps, want agent_finished after 4", r.StopReason, len(r.Steps))
	}
	stream, err := s.Load(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if err := recovery.Check("r", stream); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(stream); i++ {
		if stream[i].ID.Compare(stream[i-1].ID) <= 0 {
			t.Fatalf("key %d (%s) is not after key %d (%s)", i, stream[i].ID, i-1, stream[i-1].ID)
		}
	}
	if last := stream[len(stream)-1].ID; last.Compare(future) <= 0 {
		t.Fatalf("the last key %s is not after the future key %s", last, future)
	}
}
