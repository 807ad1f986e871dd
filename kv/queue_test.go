package kv

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/proptest"
)

// TestAnAppendCancelledWhileQueuedWritesNothing: an append queued behind a
// commit in progress whose context ends before it is taken is withdrawn:
// Append returns the context's error and the next commit writes nothing of
// it. (The commit in progress is simulated by holding leadership.)
func TestAnAppendCancelledWhileQueuedWritesNothing(t *testing.T) {
	s := storeMidCommit(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := s.Append(ctx, "q", ulid.ULID{}, proptest.SoundStream("q")[:2]...)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want the context's error", err)
	}

	if queued := s.endCommit(); queued != 0 {
		t.Errorf("%d appends left queued after their context ended", queued)
	}
	if got, err := s.Load(context.Background(), "q"); err != nil || len(got) != 0 {
		t.Fatalf("a withdrawn append wrote %d events (%v)", len(got), err)
	}
}

// TestAppendsQueuedWhileAGroupIsAppliedJoinIt: a commit takes what is
// queued, and whatever is queued while it applies that joins the same
// transaction, up to MaxGroup, so a busy store's groups are as large as the
// appenders make them. (Here the second append is queued before the commit
// starts, having been left out of the group taken.)
func TestAppendsQueuedWhileAGroupIsAppliedJoinIt(t *testing.T) {
	for _, c := range []struct {
		maxGroup, joined int
	}{{0, 1}, {2, 1}, {1, 0}} {
		t.Run(fmt.Sprint("MaxGroup=", c.maxGroup), func(t *testing.T) {
			s := storeMidCommit(t, Options{MaxGroup: c.maxGroup})
			errs := make(chan error, 2)
			for _, run := range []string{"a", "b"} {
				go func() {
					_, err := s.Append(context.Background(), run, ulid.ULID{}, proptest.SoundStream(run)[:2]...)
					errs <- err
				}()
			}
			for queued := 0; queued < 2; time.Sleep(time.Millisecond) {
				s.mu.Lock()
				queued = len(s.queue)
				s.mu.Unlock()
			}
			s.mu.Lock()
			group := s.queue[:1:1]
			s.queue = s.queue[1:]
			group[0].taken = true
			s.mu.Unlock()
			s.commit(group)

			joined := 1 - s.endCommit()
			for range 2 {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			if joined != c.joined || s.Transactions() != uint64(2-joined) {
				t.Fatalf("%d of 1 queued appends joined the group (want %d), in %d transactions", joined, c.joined, s.Transactions())
			}
		})
	}
}

// storeMidCommit opens a store in which a commit is in progress: appends
// queue, and none leads until endCommit.
func storeMidCommit(t *testing.T, o Options) *Store {
	s, err := Open(filepath.Join(t.TempDir(), "q.db"), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.mu.Lock()
	s.leading = true // another appender is committing
	s.mu.Unlock()
	return s
}

// endCommit ends the commit storeMidCommit began, committing whatever is
// queued, and returns how many appends were queued.
func (s *Store) endCommit() (queued int) {
	s.mu.Lock()
	queued = len(s.queue)
	if queued == 0 {
		s.leading = false
		s.idle.Broadcast()
		s.mu.Unlock()
	} else {
		s.lead() // releases mu
	}
	return queued
}
