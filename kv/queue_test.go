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

// TestAnAppendQueuedWithinTheCommitDelayJoinsTheGroup: after a commit that
// carried several appends, the leader waits (Options.CommitDelay) for more
// before committing: an append queued while it waits rides the same
// transaction. The wait ends as soon as the group is full (MaxGroup 2 here),
// not after the delay.
func TestAnAppendQueuedWithinTheCommitDelayJoinsTheGroup(t *testing.T) {
	s := storeLeftOpenIfFailed(t, Options{CommitDelay: time.Hour, MaxGroup: 2})
	s.lastGroup = 2 // as after a commit of two appends

	errs := make(chan error, 2)
	go func() {
		_, err := s.Append(context.Background(), "a", ulid.ULID{}, proptest.SoundStream("a")[:2]...)
		errs <- err
	}()
	waitFor(t, "the leader to wait for company after a commit of two appends", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.awaiting
	})
	go func() {
		_, err := s.Append(context.Background(), "b", ulid.ULID{}, proptest.SoundStream("b")[:2]...)
		errs <- err
	}()
	for range 2 {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(time.Minute):
			t.Fatal("the leader went on waiting (an hour's delay) with its group full")
		}
	}
	if n := s.Transactions(); n != 1 {
		t.Errorf("two appends, the second queued while the first's leader waited: %d transactions, want 1", n)
	}
}

// TestALoneAppenderNeverWaits: a commit that carried one append is followed
// by none of the commit delay, so a lone run's appends commit at once even
// with an hour's delay configured.
func TestALoneAppenderNeverWaits(t *testing.T) {
	s := storeLeftOpenIfFailed(t, Options{CommitDelay: time.Hour})
	done := make(chan error, 1)
	go func() {
		var tail ulid.ULID
		for _, ev := range proptest.SoundStream("lone") {
			envs, err := s.Append(context.Background(), "lone", tail, ev)
			if err != nil {
				done <- err
				return
			}
			tail = envs[0].ID
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a lone run's appends waited for others (a minute, with an hour's commit delay)")
	}
}

// storeLeftOpenIfFailed opens a store closed after the test unless it
// failed: Close waits for a leader that may be waiting for an hour.
func storeLeftOpenIfFailed(t *testing.T, o Options) *Store {
	s, err := Open(filepath.Join(t.TempDir(), "q.db"), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !t.Failed() {
			s.Close()
		}
	})
	return s
}

// waitFor polls cond for up to a minute, failing the test with what it
// waited for.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("waited a minute for %s", what)
}
