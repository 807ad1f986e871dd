package kv

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

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
