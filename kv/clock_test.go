package kv

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// TestKeysStayOrderedAfterTheClockStepsBack: a run's events were written
// by a process whose clock was an hour ahead (an NTP step back, a VM
// migration, a restored snapshot). A new Store, with the clock right,
// resumes the run: it continues normally and its keys keep increasing.
// (Moving the keys with bbolt directly would now be damage: every value's
// checksum covers its key.)
func TestKeysStayOrderedAfterTheClockStepsBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runs.db")
	ctx := context.Background()
	agent := func(store seams.RunStore) (engine.Definition, engine.Request) {
		model := &seamstest.Model{Turns: seamstest.Replies("ACTION: one", "ACTION: two", "ACTION: three", "FINAL: done")}
		return engine.Definition{Model: model, Parser: seamstest.Parser{}, Store: store},
			engine.Request{RunID: "r", Executor: &seamstest.Executor{}, ModelReplayPolicy: events.ReplaySafe,
				Budget: engine.Budget{MaxSteps: 10, MaxActions: 10, MaxConsecutiveParseFailures: 2, MaxPromptChars: 100_000}}
	}

	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.clock = func() time.Time { return time.Now().Add(time.Hour) }
	def, req := agent(&proptest.CrashingStore{Inner: s, After: 3})
	if _, err := engine.Run(ctx, def, req); !errors.Is(err, proptest.ErrCrashed) {
		t.Fatalf("crashing run: %v", err)
	}
	before, err := s.Load(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	future := before[len(before)-1].ID
	if time.Until(ulid.Time(future.Time())) < 50*time.Minute {
		t.Fatalf("the crashed run's last key %s is not an hour ahead", future)
	}
	s.Close()

	s, err = Open(path, Options{})
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

// TestAKeyAnotherRunHoldsIsNeverOverwritten: a run's tail is ahead of the
// clock, so its next key is the one right after its tail; when that key is
// already in the log (here a value put there by hand), the append takes the
// next free key and the value under the held key stays as it was.
func TestAKeyAnotherRunHoldsIsNeverOverwritten(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runs.db")
	ctx := context.Background()
	stream := proptest.SoundStream("A")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.clock = func() time.Time { return time.Now().Add(time.Hour) }
	envs, err := s.Append(ctx, "A", ulid.ULID{}, stream[:2]...)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	// The key right after the tail, as a clock behind it mints.
	held := new(events.IDSource).NextAfter(time.UnixMilli(0), envs[1].ID)
	foreign := []byte("a value under a key another writer holds")
	rawUpdate(t, path, func(tx *bolt.Tx) error { return tx.Bucket(logBucket).Put(held[:], foreign) })

	if s, err = Open(path, Options{}); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	next, err := s.Append(ctx, "A", envs[1].ID, stream[2])
	if err != nil {
		t.Fatal(err)
	}
	if next[0].ID == held {
		t.Fatalf("the append took the held key %s", held)
	}
	if next[0].ID.Compare(held) < 0 {
		t.Fatalf("the append's key %s is before the held key %s after the tail", next[0].ID, held)
	}
	err = s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(logBucket).Get(held[:]); string(v) != string(foreign) {
			return fmt.Errorf("the value under the held key is now %q", v)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Load(ctx, "A"); err != nil || len(got) != 3 {
		t.Fatalf("load: %d events, %v", len(got), err)
	}
}

// TestKeysPutThisSessionAreNeverOverwritten: two runs written in the same
// millisecond by a process whose clock was ahead hold consecutive keys.
// With the clock right again, the second run's next key is the one after
// its tail, which the first run's next key is too: whichever appends
// second must see it taken though it was put after the store opened (the
// log's highest key is raised with every put, not only read at open).
func TestKeysPutThisSessionAreNeverOverwritten(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runs.db")
	ctx := context.Background()
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ahead := time.Now().Add(time.Hour)
	s.clock = func() time.Time { return ahead } // one millisecond: keys one apart
	tails := map[string]ulid.ULID{}
	for _, run := range []string{"B", "A"} {
		envs, err := s.Append(ctx, run, ulid.ULID{}, proptest.SoundStream(run)[0])
		if err != nil {
			t.Fatal(err)
		}
		tails[run] = envs[0].ID
	}
	s.Close()

	if s, err = Open(path, Options{}); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, run := range []string{"A", "B"} {
		if _, err := s.Append(ctx, run, tails[run], proptest.SoundStream(run)[1]); err != nil {
			t.Fatal(err)
		}
	}
	for _, run := range []string{"A", "B"} {
		if got, err := s.Load(ctx, run); err != nil || len(got) != 2 {
			t.Fatalf("run %s: %d events, %v", run, len(got), err)
		}
	}
}
