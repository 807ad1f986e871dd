package kv

import (
	"context"
	"errors"
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
