package kv

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// cancelOf is CancelRequested's answer, which must not fail.
func cancelOf(t *testing.T, s *Store, runID string) *seams.CancelRequest {
	t.Helper()
	r, err := s.CancelRequested(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestTheFirstCancelRequestStays: a request is durable — a later Open,
// read-only too, answers it — and a second request changes nothing and
// writes nothing.
func TestTheFirstCancelRequestStays(t *testing.T) {
	s := openQueueStore(t, formatLog)
	ctx := context.Background()
	at := time.Unix(1_900_000_000, 123)
	s.clock = func() time.Time { return at }
	submitRun(t, s, "alpha-r", "alpha")
	if holder, err := s.RequestCancel(ctx, "alpha-r", "ops@example"); err != nil || holder != "" {
		t.Fatalf("RequestCancel: %q %v, want no holder", holder, err)
	}
	before := s.Transactions()
	s.clock = func() time.Time { return at.Add(time.Hour) }
	if _, err := s.RequestCancel(ctx, "alpha-r", "someone else"); err != nil {
		t.Fatal(err)
	}
	if n := s.Transactions() - before; n != 0 {
		t.Errorf("a second request committed %d transactions", n)
	}
	want := seams.CancelRequest{By: "ops@example", At: at}
	check := func(how string, s *Store) {
		t.Helper()
		if r := cancelOf(t, s, "alpha-r"); r == nil || r.By != want.By || !r.At.Equal(want.At) {
			t.Errorf("%s: CancelRequested %+v, want %+v", how, r, want)
		}
		if info := describeRun(t, s, "alpha-r"); info.CancelRequested == nil || *info.CancelRequested != *cancelOf(t, s, "alpha-r") || info.Agent != "alpha" {
			t.Errorf("%s: Describe %+v, want the request beside the agent", how, info)
		}
	}
	check("this Store", s)
	s = reopen(t, s, Options{})
	check("a later Open", s)
	check("a read-only Open", reopen(t, s, Options{ReadOnly: true}))
}

// TestRequestCancelNamesTheHolder: the holder is this Store's Owner while
// a driver of this process holds the run, or this Store claimed it and no
// driver has taken it yet (its worker takes it at once and sees the
// request), else nobody: then the caller may end the run itself.
func TestRequestCancelNamesTheHolder(t *testing.T) {
	s := openQueueStore(t, formatLog)
	ctx := context.Background()
	for _, c := range []struct {
		run    string
		holder string
		setup  func(run string)
	}{
		{"alpha-queued", "", func(run string) { submitRun(t, s, run, "alpha") }},
		{"plain", "", func(run string) { submitRun(t, s, run, "") }},
		{"beta-claimed", s.Owner(), func(run string) { submitRun(t, s, run, "beta"); claimExactly(t, s, run) }},
		{"delta-let-go", "", func(run string) {
			submitRun(t, s, run, "delta")
			claimExactly(t, s, run)
			release, err := s.LockRun(run)
			if err != nil {
				t.Fatal(err)
			}
			release()
		}},
		{"gamma-driven", s.Owner(), func(run string) {
			submitRun(t, s, run, "gamma")
			claimExactly(t, s, run)
			release, err := s.LockRun(run)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(release)
		}},
		{"plain-driven", s.Owner(), func(run string) {
			submitRun(t, s, run, "")
			release, err := s.LockRun(run)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(release)
		}},
	} {
		c.setup(c.run)
		if holder, err := s.RequestCancel(ctx, c.run, "ops"); err != nil || holder != c.holder {
			t.Errorf("%s: holder %q (%v), want %q", c.run, holder, err, c.holder)
		}
		// A request through the Store that holds the run is seen at once.
		if r := cancelOf(t, s, c.run); r == nil || r.By != "ops" {
			t.Errorf("%s: CancelRequested %+v right after the request", c.run, r)
		}
	}
}

// TestRequestCancelRefuses: a run the store does not hold, a finished
// one, a bad run id or requester, a read-only store — each refused,
// writing nothing.
func TestRequestCancelRefuses(t *testing.T) {
	s := openQueueStore(t, formatLog)
	ctx := context.Background()
	finishRun(t, s, "alpha-finished", submitRun(t, s, "alpha-finished", "alpha"))
	submitRun(t, s, "alpha-r", "alpha")
	before := s.Transactions()
	for _, c := range []struct {
		run, by string
		want    error
		says    string
	}{
		{"never-written", "ops", seams.ErrNoRun, ""},
		{"alpha-finished", "ops", seams.ErrRunFinished, ""},
		{"", "ops", seams.ErrInvalidRunID, ""},
		{"alpha-r", strings.Repeat("o", maxCancelBy+1), nil, "more than 1024"},
	} {
		_, err := s.RequestCancel(ctx, c.run, c.by)
		if err == nil || c.want != nil && !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%q by %.10q: got %v, want %v saying %q", c.run, c.by, err, c.want, c.says)
		}
		if r, _ := s.CancelRequested(ctx, c.run); r != nil {
			t.Errorf("%q: a refused request is seen: %+v", c.run, r)
		}
	}
	if n := s.Transactions() - before; n != 0 {
		t.Errorf("refused requests committed %d transactions", n)
	}
	r := reopen(t, s, Options{ReadOnly: true})
	if _, err := r.RequestCancel(ctx, "alpha-r", "ops"); !errors.Is(err, ErrReadOnly) {
		t.Errorf("read-only: %v, want ErrReadOnly", err)
	}
}

// TestACancelRequestOfARunWithoutAnAgentIsNoWorkersToClaim: a request for
// a run no worker pool drives gets a queue entry of its own, which no
// claim takes; the run stays interrupted, its request listed.
func TestACancelRequestOfARunWithoutAnAgentIsNoWorkersToClaim(t *testing.T) {
	s := openQueueStore(t, formatLog)
	ctx := context.Background()
	submitRun(t, s, "plain", "")
	if _, err := s.RequestCancel(ctx, "plain", "ops"); err != nil {
		t.Fatal(err)
	}
	if got := claimIDs(t, s, 5, "alpha"); len(got) != 0 {
		t.Errorf("claimed %q", got)
	}
	if err := s.RequeueRun(ctx, "plain"); !errors.Is(err, seams.ErrNotQueued) {
		t.Errorf("requeue: %v, want ErrNotQueued", err)
	}
	if info := listed(t, s, "plain"); info.Status != seams.StatusInterrupted || info.Agent != "" || info.CancelRequested == nil {
		t.Errorf("listed %+v, want interrupted, no agent, the request", info)
	}
	if got := queueKeys(t, s); !slices.Equal(got, []string{"plain"}) {
		t.Errorf("the queue holds %q, want the request's entry", got)
	}
}

// TestACancelRequestLeavesWithItsRun: a requeue keeps the request; the
// run's end, or its deletion, takes it away, from the file and from
// CancelRequested.
func TestACancelRequestLeavesWithItsRun(t *testing.T) {
	s := openQueueStore(t, formatLog)
	ctx := context.Background()
	tail := submitRun(t, s, "alpha-finished", "alpha")
	submitRun(t, s, "alpha-deleted", "alpha")
	for _, run := range []string{"alpha-finished", "alpha-deleted"} {
		if _, err := s.RequestCancel(ctx, run, "ops"); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.RequeueRun(ctx, "alpha-finished"); err != nil {
		t.Fatal(err)
	}
	if r, info := cancelOf(t, s, "alpha-finished"), describeRun(t, s, "alpha-finished"); r == nil || info.CancelRequested == nil {
		t.Errorf("a requeue dropped the cancel request: %+v, described %+v", r, info)
	}
	finishRun(t, s, "alpha-finished", tail)
	if err := s.DeleteRun(ctx, "alpha-deleted", true); err != nil {
		t.Fatal(err)
	}
	for _, run := range []string{"alpha-finished", "alpha-deleted"} {
		if r := cancelOf(t, s, run); r != nil {
			t.Errorf("%s: CancelRequested %+v after the run left", run, r)
		}
	}
	submitRun(t, s, "alpha-deleted", "alpha") // the id, started again, is a new run
	if r := cancelOf(t, s, "alpha-deleted"); r != nil {
		t.Errorf("a new run under a deleted run's id inherits its request: %+v", r)
	}
	if got := queueKeys(t, s); !slices.Equal(got, []string{"alpha-deleted"}) {
		t.Errorf("the queue holds %q, want the new run's entry alone", got)
	}

	// An entry a run of that id left behind (a version that kept no queue
	// deleted the run) does not carry over to a new run either.
	rawUpdate(t, s.Path(), func(tx *bolt.Tx) error {
		return putQueued(tx.Bucket(queueBucket), "ghost", queueEntry{CancelBy: "ops", CancelAt: time.Now().UnixNano()})
	})
	s = reopen(t, s, Options{})
	submitRun(t, s, "ghost", "")
	if r := cancelOf(t, s, "ghost"); r != nil {
		t.Errorf("a new run inherits a stale entry's request: %+v", r)
	}
}

// TestAFailedCommitLeavesTheCancelMirrorAsTheFileIs: when the disk
// refuses a commit, what CancelRequested answers is what the file holds:
// a request whose transaction failed is not seen, and a run whose
// finishing append failed keeps its request.
func TestAFailedCommitLeavesTheCancelMirrorAsTheFileIs(t *testing.T) {
	s := openQueueStore(t, formatLog)
	ctx := context.Background()
	tail := submitRun(t, s, "alpha-kept", "alpha")
	submitRun(t, s, "alpha-refused", "alpha")
	if _, err := s.RequestCancel(ctx, "alpha-kept", "ops"); err != nil {
		t.Fatal(err)
	}
	s.file.Close() // every write from now on fails
	if _, err := s.Append(ctx, "alpha-kept", tail, proptest.SoundStream("alpha-kept")[1:]...); err == nil {
		t.Fatal("an append to a closed file succeeded")
	}
	if r := cancelOf(t, s, "alpha-kept"); r == nil {
		t.Error("a finishing append that failed dropped the run's request")
	}
	if _, err := s.RequestCancel(ctx, "alpha-refused", "ops"); err == nil {
		t.Fatal("a request to a closed file succeeded")
	}
	if r := cancelOf(t, s, "alpha-refused"); r != nil {
		t.Errorf("a request whose commit failed is seen: %+v", r)
	}
}

// TestADamagedQueueEntryHidesNoCancelRequest: whether a run with a
// damaged queue entry was asked to cancel is unknown, and CancelRequested
// says so (an error matching events.ErrCorruption: the engine carries on
// as if no request was made); a request writes the entry anew, with the
// run's agent read from its RunStarted.
func TestADamagedQueueEntryHidesNoCancelRequest(t *testing.T) {
	for _, d := range queueDamages {
		t.Run(d.name, func(t *testing.T) {
			s := damagedQueue(t, d.damage)
			ctx := context.Background()
			if r, err := s.CancelRequested(ctx, "r"); r != nil || !errors.Is(err, events.ErrCorruption) {
				t.Errorf("CancelRequested: %+v %v, want corruption", r, err)
			}
			if _, err := s.RequestCancel(ctx, "r", "ops"); err != nil {
				t.Fatal(err)
			}
			if r := cancelOf(t, s, "r"); r == nil || r.By != "ops" {
				t.Errorf("CancelRequested after the request: %+v", r)
			}
			if info := describeRun(t, s, "r"); info.Agent != "alpha" || info.LastError != "" || info.CancelRequested == nil {
				t.Errorf("described %+v, want agent alpha, the request, no damage", info)
			}
		})
	}
}

// TestAnOperatorCancelsARunThroughTheStore: engine.Cancel through a kv
// store — a run another driver of the process holds ends cancelled before
// its side effect; a run nobody holds is ended by Cancel and leaves the
// queue.
func TestAnOperatorCancelsARunThroughTheStore(t *testing.T) {
	s := openQueueStore(t, formatLog)
	ctx := context.Background()
	model := &seamstest.Model{Turns: seamstest.Replies("ACTION: rm -rf build", "FINAL: done")}
	exec := &seamstest.Executor{}
	def := engine.Definition{Model: model, Parser: seamstest.Parser{}, Store: s}
	req := engine.Request{RunID: "driven", Agent: "alpha", Executor: exec, ModelReplayPolicy: events.ReplaySafe,
		Budget: engine.Budget{MaxSteps: 10, MaxActions: 10, MaxConsecutiveParseFailures: 2, MaxPromptChars: 100_000}}
	var cancelled engine.Cancellation
	var cancelErr error
	model.OnCall = func(seams.ModelCall) { cancelled, cancelErr = engine.Cancel(ctx, s, "driven", "ops") }
	res, err := engine.Run(ctx, def, req)
	if err != nil || res.StopReason != events.StopCancelled {
		t.Fatalf("Run: %v %+v, want cancelled", err, res)
	}
	if cancelErr != nil || cancelled.Holder != s.Owner() {
		t.Fatalf("Cancel: %+v %v, want the holder named", cancelled, cancelErr)
	}
	if n := len(exec.Calls()); n != 0 {
		t.Fatalf("the action ran %d times after the cancel request", n)
	}

	submitRun(t, s, "alpha-idle", "alpha")
	c, err := engine.Cancel(ctx, s, "alpha-idle", "ops")
	if err != nil || c.Holder != "" || c.Result == nil || c.Result.StopReason != events.StopCancelled {
		t.Fatalf("Cancel of a run nobody holds: %+v %v", c, err)
	}
	if got := queueKeys(t, s); len(got) != 0 {
		t.Errorf("the queue holds %q after both runs ended", got)
	}
}
