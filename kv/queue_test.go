package kv

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"testing/synctest"
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

// TestAnAppendTakenIntoAGroupReportsItsCommit: once a leader has taken an
// append into a group, that group's commit writes it whatever becomes of
// the appender's context, so Append waits for the commit and reports its
// outcome — nil, the events loadable — never the context's error for a
// write that is durable. (synctest tells when the appender has seen its
// context end: it is then blocked until the commit, or has returned.)
func TestAnAppendTakenIntoAGroupReportsItsCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := storeMidCommit(t, Options{NoServe: true}) // in a bubble: no listener blocked in Accept
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		res := appendAside(ctx, s, "t")
		synctest.Wait() // queued, waiting for the leader
		s.mu.Lock()
		group := s.join(nil) // as a leader takes it
		s.mu.Unlock()
		if len(group) != 1 {
			t.Fatalf("%d appends queued, want 1", len(group))
		}
		cancel()
		synctest.Wait() // the appender has seen its context end
		select {
		case err := <-res:
			t.Fatalf("an append taken into a group returned %v before the group committed", err)
		default:
		}
		s.commit(group)
		if err := <-res; err != nil {
			t.Fatalf("an append its group committed returned %v", err)
		}
		s.endCommit()
		if got, err := s.Load(context.Background(), "t"); err != nil || len(got) != 2 {
			t.Fatalf("the committed append loads as %d events (%v), want 2", len(got), err)
		}
	})
}

// TestAnAppendPromotedToLeaderAsItsContextEndsLeads: an append made the
// leader (lead's hand-off at the end of a commit) whose context ends at
// that moment still leads: it commits what is queued, itself first, and
// reports that — were it to withdraw, nobody would lead and every later
// append, and Close, would wait forever.
func TestAnAppendPromotedToLeaderAsItsContextEndsLeads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := storeMidCommit(t, Options{NoServe: true}) // in a bubble: no listener blocked in Accept
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		res := appendAside(ctx, s, "p")
		synctest.Wait() // queued, waiting for the leader
		s.mu.Lock()
		cancel() // the appender wakes for its context, and waits for mu
		next := s.queue[0]
		next.lead = true // the commit in progress ends: lead's hand-off
		close(next.wake)
		s.mu.Unlock()
		if err := <-res; err != nil {
			t.Fatalf("an append promoted to leader returned %v", err)
		}
		if got, err := s.Load(context.Background(), "p"); err != nil || len(got) != 2 {
			t.Fatalf("the promoted append loads as %d events (%v), want 2", len(got), err)
		}
		if _, err := s.Append(context.Background(), "after", ulid.ULID{}, proptest.SoundStream("after")[:1]...); err != nil {
			t.Fatal(err)
		}
	})
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
			appendAsync(s, "a", errs)
			appendAsync(s, "b", errs)
			waitFor(t, "two appends to queue", queued(s, 2))
			s.mu.Lock()
			group := s.queue[:1:1]
			s.queue = s.queue[1:]
			group[0].taken = true
			s.mu.Unlock()
			s.commit(group)

			joined := 1 - s.endCommit()
			receive(t, errs, 2, "the appends did not commit")
			if joined != c.joined || s.Transactions() != uint64(2-joined) {
				t.Fatalf("%d of 1 queued appends joined the group (want %d), in %d transactions", joined, c.joined, s.Transactions())
			}
		})
	}
}

// storeMidCommit opens a store in which a commit is in progress: appends
// queue, and none leads until endCommit.
func storeMidCommit(t *testing.T, o Options) *Store {
	s := queueStore(t, o)
	s.beginCommit()
	return s
}

// beginCommit makes the store behave as if another appender were
// committing: appends queue, and none leads until endCommit.
func (s *Store) beginCommit() {
	s.mu.Lock()
	s.leading = true
	s.mu.Unlock()
}

// endCommit ends the commit beginCommit began, committing whatever is
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

// TestAppendsQueuedWithinTheCommitDelayJoinTheGroup: after a commit of two
// appends, the next leader waits for company (Options.CommitDelay) before
// committing; each append queued while it waits rides its transaction, and
// the wait starts again after each, until the group is full (MaxGroup 3):
// then it commits without waiting out the delay.
func TestAppendsQueuedWithinTheCommitDelayJoinTheGroup(t *testing.T) {
	s := queueStore(t, Options{MaxGroup: 3})
	s.delay = time.Hour // past MaxCommitDelay: the test ends each wait itself
	commitTwo(t, s)

	errs := make(chan error, 3)
	appendAsync(s, "a", errs)
	waitFor(t, "the leader to wait for company after a commit of two appends", waitsReach(s, 1))
	appendAsync(s, "b", errs)
	waitFor(t, "the leader to wait again once an append joined", waitsReach(s, 2))
	appendAsync(s, "c", errs)
	receive(t, errs, 3, "the leader went on waiting (an hour's delay) with its group full")
	if n := s.Transactions(); n != 2 {
		t.Errorf("%d transactions, want 2: the first two appends', then the three queued while the leader waited", n)
	}
}

// TestALeaderWaitsOnlyAfterACommitOfSeveral: a leader waits for company
// only after a commit that carried more than one append, whoever's, so a
// run appending alone to a fresh store never waits, even with an hour's
// delay; after a commit of two other runs' appends it waits once, and its
// commit, carrying it alone, ends the waiting.
func TestALeaderWaitsOnlyAfterACommitOfSeveral(t *testing.T) {
	s := queueStore(t, Options{})
	s.delay = time.Hour
	lone := func(run string) {
		errs := make(chan error, 1)
		go func() {
			var tail ulid.ULID
			for _, ev := range proptest.SoundStream(run)[:3] {
				envs, err := s.Append(context.Background(), run, tail, ev)
				if err != nil {
					errs <- err
					return
				}
				tail = envs[0].ID
			}
			errs <- nil
		}()
		receive(t, errs, 1, "a lone run's appends waited for company (an hour's delay)")
	}
	lone("alone")
	if s.waits != 0 {
		t.Fatalf("a lone run on a fresh store: the leader waited %d times", s.waits)
	}

	commitTwo(t, s)
	s.delay = 5 * time.Millisecond // it waits once, for nobody
	lone("after")
	if s.waits != 1 {
		t.Errorf("three lone appends after a commit of two: the leader waited %d times, want 1", s.waits)
	}
}

// TestALeaderWhoseYieldOutlastsTheDelayWaitsNoMore: a leader waiting for
// company yields its processor between looks at the queue; a yield that
// outlasts the delay says the processors are busy with other goroutines,
// whose appends queue without being waited for (and each further yield
// puts the leader, on whom every appender waits, behind them). The leader
// then commits what it holds: an append that joined during that yield
// rides the transaction, and the leader does not wait again after it.
func TestALeaderWhoseYieldOutlastsTheDelayWaitsNoMore(t *testing.T) {
	s := queueStore(t, Options{})
	s.delay = time.Millisecond
	commitTwo(t, s)
	errs := make(chan error, 2)
	yields := 0
	s.yield = func() {
		if yields++; yields == 1 {
			appendAsync(s, "b", errs) // it queues while the leader yields,
			waitFor(t, "an append to queue while the leader yields", queued(s, 1))
			time.Sleep(5 * s.delay) // and the yield outlasts the delay
		}
	}
	before := s.Transactions()
	appendAsync(s, "a", errs)
	receive(t, errs, 2, "the appends did not commit")
	if s.waits != 1 || s.Transactions()-before != 1 {
		t.Errorf("the leader waited for company %d times (want 1: not again once a yield outlasted the delay), in %d transactions (want 1)",
			s.waits, s.Transactions()-before)
	}
}

// TestClosingEndsTheCommitDelay: Close ends a leader's wait for company
// (no append can come any more) and the group it holds commits.
func TestClosingEndsTheCommitDelay(t *testing.T) {
	s := queueStore(t, Options{})
	s.delay = time.Hour
	commitTwo(t, s)
	errs := make(chan error, 2)
	appendAsync(s, "a", errs)
	waitFor(t, "the leader to wait for company", waitsReach(s, 1))
	go func() { errs <- s.Close() }()
	receive(t, errs, 2, "Close waited out the leader's hour-long wait for company")
	if n := s.Transactions(); n != 2 {
		t.Errorf("%d transactions, want 2 (the group the closing store's leader held committed)", n)
	}
}

// TestOpenResolvesMaxGroup: what Options.MaxGroup becomes.
func TestOpenResolvesMaxGroup(t *testing.T) {
	for _, c := range []struct{ set, want int }{{0, DefaultMaxGroup}, {-1, DefaultMaxGroup}, {1, 1}, {4096, 4096}} {
		s := queueStore(t, Options{MaxGroup: c.set})
		if s.maxGroup != c.want {
			t.Errorf("Options.MaxGroup %d: a group holds up to %d appends, want %d", c.set, s.maxGroup, c.want)
		}
	}
}

// TestOpenResolvesTheCommitDelay: what Options.CommitDelay becomes, and the
// bound Open holds it to.
func TestOpenResolvesTheCommitDelay(t *testing.T) {
	for _, c := range []struct {
		o    Options
		want time.Duration
		err  string
	}{
		{Options{}, DefaultCommitDelay, ""},
		{Options{NoSync: true}, 0, ""},
		{Options{NoSync: true, CommitDelay: 40 * time.Microsecond}, 40 * time.Microsecond, ""},
		{Options{CommitDelay: -1}, 0, ""},
		{Options{CommitDelay: MaxCommitDelay}, MaxCommitDelay, ""},
		{Options{CommitDelay: 2 * time.Millisecond}, 0, "kv: Options.CommitDelay 2ms is more than MaxCommitDelay (1ms)"},
	} {
		t.Run(fmt.Sprintf("%+v", c.o), func(t *testing.T) {
			s, err := Open(filepath.Join(t.TempDir(), "d.db"), c.o)
			if c.err != "" {
				if err == nil || err.Error() != c.err {
					t.Fatalf("got %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if s.delay != c.want {
				t.Errorf("delay %v, want %v", s.delay, c.want)
			}
		})
	}
}

// commitTwo commits two appends, of two new runs, in one transaction, as
// a busy store does: both queue while leadership is held, then one commit
// takes them.
func commitTwo(t *testing.T, s *Store) {
	t.Helper()
	before := s.Transactions()
	s.beginCommit()
	errs := make(chan error, 2)
	appendAsync(s, fmt.Sprint("pair-x-", before), errs)
	appendAsync(s, fmt.Sprint("pair-y-", before), errs)
	waitFor(t, "two appends to queue", queued(s, 2))
	s.endCommit()
	receive(t, errs, 2, "the two appends did not commit")
	if n := s.Transactions() - before; n != 1 {
		t.Fatalf("two appends queued together committed in %d transactions", n)
	}
}

// appendAsync appends the first two events of a new run in a goroutine,
// sending its error to errs.
func appendAsync(s *Store, run string, errs chan<- error) {
	go func() {
		_, err := s.Append(context.Background(), run, ulid.ULID{}, proptest.SoundStream(run)[:2]...)
		errs <- err
	}()
}

// receive takes n results from errs, failing on an error or on a minute
// without one (stuck).
func receive(t *testing.T, errs <-chan error, n int, stuck string) {
	t.Helper()
	for range n {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(time.Minute):
			t.Fatal(stuck)
		}
	}
}

// queued is a condition for waitFor: n appends are queued.
func queued(s *Store, n int) func() bool {
	return func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.queue) == n
	}
}

// waitsReach is a condition for waitFor: the store's leaders began n
// waits for company.
func waitsReach(s *Store, n int) func() bool {
	return func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.waits >= n
	}
}

// queueStore opens a store closed after the test unless it failed: Close
// waits for a leader, which a failed test may have left waiting for an
// hour or holding leadership.
func queueStore(t *testing.T, o Options) *Store {
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

// appendAside appends the start of run's sound stream in a goroutine of
// its own; the channel gets Append's error.
func appendAside(ctx context.Context, s *Store, run string) <-chan error {
	res := make(chan error, 1)
	go func() {
		_, err := s.Append(ctx, run, ulid.ULID{}, proptest.SoundStream(run)[:2]...)
		res <- err
	}()
	return res
}
