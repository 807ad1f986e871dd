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
	s, err := Open(filepath.Join(t.TempDir(), "q.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.mu.Lock()
	s.leading = true // another appender is committing
	s.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err = s.Append(ctx, "q", ulid.ULID{}, proptest.SoundStream("q")[:2]...)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want the context's error", err)
	}

	// The commit in progress ends and commits whatever is queued.
	s.mu.Lock()
	queued := len(s.queue)
	if queued == 0 {
		s.leading = false
		s.idle.Broadcast()
		s.mu.Unlock()
	} else {
		s.lead() // releases mu
	}
	if queued != 0 {
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
			s, err := Open(filepath.Join(t.TempDir(), "q.db"), Options{MaxGroup: c.maxGroup})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			s.mu.Lock()
			s.leading = true // another appender is committing
			s.mu.Unlock()

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

			s.mu.Lock()
			joined := 1 - len(s.queue)
			if len(s.queue) > 0 {
				s.lead() // commits the rest; releases mu
			} else {
				s.leading = false
				s.idle.Broadcast()
				s.mu.Unlock()
			}
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
