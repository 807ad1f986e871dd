package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
)

// startRun starts run id for agent (a run no worker claims when agent is
// empty) with its first two events, and returns its tail.
func startRun(t testing.TB, s *pgstore.Store, id, agent string) ulid.ULID {
	t.Helper()
	stream := proptest.SoundStream(id)
	started := stream[0].(events.RunStarted)
	started.Agent = agent
	envs, err := s.Append(context.Background(), id, ulid.ULID{}, started, stream[1])
	if err != nil {
		t.Fatal(err)
	}
	return envs[1].ID
}

// finishRun appends run id's end after tail.
func finishRun(t testing.TB, s *pgstore.Store, id string, tail ulid.ULID) {
	t.Helper()
	stream := proptest.SoundStream(id)
	if _, err := s.Append(context.Background(), id, tail, stream[len(stream)-1]); err != nil {
		t.Fatal(err)
	}
}

// claimed is what s claims of agents, at most max, by run id.
func claimed(t testing.TB, s *pgstore.Store, agents []string, max int) []string {
	t.Helper()
	claims, err := s.ClaimRuns(context.Background(), agents, max)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range claims {
		ids = append(ids, c.RunID)
	}
	return ids
}

// described is run id's entry by s's Describe.
func described(t testing.TB, s *pgstore.Store, id string) seams.RunInfo {
	t.Helper()
	info, err := s.Describe(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// lock takes run id with LockRun and gives it back when t ends.
func lock(t testing.TB, s *pgstore.Store, id string) func() {
	t.Helper()
	release, err := s.LockRun(id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	return release
}

// TestClaimTakesOnlyClaimableRuns: a claim takes the unfinished runs of
// the agents it names that nobody live holds and whose retry time has
// come — never a finished run, another agent's, a run without an agent,
// one a live worker holds, or one waiting for its retry — leasing each to
// the claimer.
func TestClaimTakesOnlyClaimableRuns(t *testing.T) {
	s := open(t, pgstore.Options{})
	other := open(t, pgstore.Options{Schema: s.Schema()})
	runs := []struct {
		id, agent string
		setup     func(id string, tail ulid.ULID)
		claimable bool
	}{
		{"queued", "a", nil, true},
		{"another agent's", "b", nil, false},
		{"without an agent", "", nil, false},
		{"finished", "a", func(id string, tail ulid.ULID) { finishRun(t, s, id, tail) }, false},
		{"held by a live worker", "a", func(id string, _ ulid.ULID) { lock(t, other, id) }, false},
		{"held by a lease that ran out", "a", func(id string, _ ulid.ULID) {
			exec(t, s.Schema(), `UPDATE {{schema}}.runs SET lease_owner = 'dead', lease_expires = now() - interval '1 second' WHERE run_id = $1`, id)
		}, true},
		{"waiting for its retry", "a", func(id string, _ ulid.ULID) {
			exec(t, s.Schema(), `UPDATE {{schema}}.runs SET failures = 1, retry_at = now() + interval '1 hour' WHERE run_id = $1`, id)
		}, false},
		{"whose retry time came", "a", func(id string, _ ulid.ULID) {
			exec(t, s.Schema(), `UPDATE {{schema}}.runs SET failures = 1, retry_at = now() - interval '1 second' WHERE run_id = $1`, id)
		}, true},
	}
	var want []string
	for _, r := range runs {
		tail := startRun(t, s, r.id, r.agent)
		if r.setup != nil {
			r.setup(r.id, tail)
		}
		if r.claimable {
			want = append(want, r.id)
		}
	}
	got := claimed(t, s, []string{"a"}, 100)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("claimed %q, want %q", got, want)
	}
	for _, id := range got {
		if info := described(t, s, id); info.Owner != s.Owner() || info.Status != seams.StatusRunning || !info.LeaseExpires.After(time.Now()) {
			t.Errorf("%s after its claim: owner %q, %s until %v; want held by the claimer (%s)", id, info.Owner, info.Status, info.LeaseExpires, s.Owner())
		}
	}
	if again := claimed(t, other, []string{"a", "b"}, 100); !slices.Equal(again, []string{"another agent's"}) {
		t.Errorf("another store's claim after it: %q, want only the other agent's run", again)
	}
}

// TestClaimTakesAtMostMaxOldestFirst: a claim takes at most max runs, the
// ones started first; an empty agent list or a max under 1 claims
// nothing, and a name ValidAgent refuses is an error naming it.
func TestClaimTakesAtMostMaxOldestFirst(t *testing.T) {
	s := open(t, pgstore.Options{})
	for i := range 5 {
		startRun(t, s, fmt.Sprintf("r%d", i), "a")
	}
	for _, c := range []struct {
		agents []string
		max    int
	}{{nil, 5}, {[]string{}, 5}, {[]string{"a"}, 0}, {[]string{"a"}, -1}} {
		if got, err := s.ClaimRuns(context.Background(), c.agents, c.max); err != nil || len(got) != 0 {
			t.Errorf("claim of %q, at most %d: %v, %v; want nothing", c.agents, c.max, got, err)
		}
	}
	for _, want := range [][]string{{"r0", "r1"}, {"r2", "r3"}, {"r4"}, nil} {
		if got := claimed(t, s, []string{"a"}, 2); !slices.Equal(got, want) {
			t.Fatalf("claim of at most 2: %q, want %q", got, want)
		}
	}
	for _, bad := range []string{"", "a\x00b", strings.Repeat("x", seams.MaxAgentBytes+1)} {
		_, err := s.ClaimRuns(context.Background(), []string{"a", bad}, 1)
		if !errors.Is(err, seams.ErrInvalidAgent) {
			t.Errorf("claim naming agent %.20q: %v, want ErrInvalidAgent", bad, err)
		}
	}
}

// TestAnAgentRefusedByTheRuleIsNotStarted: a RunStarted naming an agent
// ValidAgent refuses is refused by the append, writing nothing.
func TestAnAgentRefusedByTheRuleIsNotStarted(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgstore.Options{})
	started := events.RunStarted{RunID: "r", SchemaVersion: events.CurrentSchemaVersion, Agent: "bad\x00agent"}
	if _, err := s.Append(ctx, "r", ulid.ULID{}, started); !errors.Is(err, seams.ErrInvalidAgent) {
		t.Fatalf("start for an agent holding NUL: %v, want ErrInvalidAgent", err)
	}
	if got, err := s.Load(ctx, "r"); err != nil || len(got) != 0 {
		t.Fatalf("the refused start left %d events, %v", len(got), err)
	}
}

// TestClaimersNeverShareARun: four workers claiming one agent's runs at
// once, each as many as it draws at a time until none is left, claim
// every run exactly once between them.
func TestClaimersNeverShareARun(t *testing.T) {
	first := open(t, pgstore.Options{})
	const runs = 200
	for i := range runs {
		startRun(t, first, fmt.Sprintf("r%03d", i), "a")
	}
	workers := []*pgstore.Store{first}
	for range 3 {
		workers = append(workers, open(t, pgstore.Options{Schema: first.Schema()}))
	}
	var (
		mu    sync.Mutex
		owner = map[string]int{}
		wg    sync.WaitGroup
		start = make(chan struct{})
	)
	for w, s := range workers {
		wg.Go(func() {
			<-start
			for {
				got, err := s.ClaimRuns(context.Background(), []string{"a"}, 1+rand.IntN(7))
				if err != nil {
					t.Error(err)
					return
				}
				if len(got) == 0 {
					return
				}
				mu.Lock()
				for _, c := range got {
					if prev, dup := owner[c.RunID]; dup {
						t.Errorf("run %s claimed by worker %d and worker %d", c.RunID, prev, w)
						mu.Unlock()
						return
					}
					owner[c.RunID] = w
				}
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	if len(owner) != runs {
		t.Fatalf("%d runs claimed, want all %d", len(owner), runs)
	}
	for id, w := range owner {
		if info := described(t, first, id); info.Owner != workers[w].Owner() {
			t.Errorf("run %s claimed by worker %d is held by %q, want %q", id, w, info.Owner, workers[w].Owner())
		}
	}
}

// TestAClaimedRunIsTheClaimersToLock: LockRun of a claimed run succeeds
// for the store that claimed it and fails for another, naming the
// claimer; a claim nobody locks is not renewed, so it runs out after one
// term and the run is claimable again.
func TestAClaimedRunIsTheClaimersToLock(t *testing.T) {
	const term = 2 * time.Second
	s := open(t, pgstore.Options{LeaseDuration: term})
	other := open(t, pgstore.Options{Schema: s.Schema(), LeaseDuration: term})
	tail := startRun(t, s, "r", "a")
	startRun(t, s, "unlocked", "a")
	if got := claimed(t, s, []string{"a"}, 2); len(got) != 2 {
		t.Fatalf("claimed %q", got)
	}
	if _, err := other.LockRun("r"); !errors.Is(err, seams.ErrRunLocked) || !strings.Contains(err.Error(), s.Owner()) {
		t.Fatalf("another store's LockRun of a claimed run: %v, want ErrRunLocked naming %s", err, s.Owner())
	}
	release := lock(t, s, "r")
	// Held past the claim's term: LockRun's lease is renewed.
	time.Sleep(term + term/4)
	if _, err := s.Append(context.Background(), "r", tail, proptest.SoundStream("r")[2]); err != nil {
		t.Fatalf("the claimer's append after its LockRun: %v", err)
	}
	if got := claimed(t, other, []string{"a"}, 2); !slices.Equal(got, []string{"unlocked"}) {
		t.Fatalf("another store's claim a term later: %q, want only the claim nobody locked", got)
	}
	release()
	if info := described(t, s, "r"); info.Owner != "" || info.Status != seams.StatusAwaiting {
		t.Fatalf("after the claimer's release: owner %q, %s; want nobody, awaiting", info.Owner, info.Status)
	}
}

// TestAFinishedRunLeavesTheQueue: the append that finishes a run takes it
// out of the queue in its own statement — alone, and grouped with other
// runs' appends — so no claim ever finds it, lease or no lease.
func TestAFinishedRunLeavesTheQueue(t *testing.T) {
	s := open(t, pgstore.Options{MaxConns: 4})
	other := open(t, pgstore.Options{Schema: s.Schema()})
	ids := []string{"alone", "g0", "g1", "g2", "g3"}
	tails := map[string]ulid.ULID{}
	for _, id := range ids {
		tails[id] = startRun(t, s, id, "a")
	}
	if got := claimed(t, s, []string{"a"}, 10); len(got) != len(ids) {
		t.Fatalf("claimed %q", got)
	}
	for _, id := range ids {
		lock(t, s, id)
	}
	finishRun(t, s, "alone", tails["alone"])
	last := func(id string) events.Event { stream := proptest.SoundStream(id); return stream[len(stream)-1] }
	for id, err := range groupWith(t, s, last, "g0", tails, "g1", "g2", "g3") {
		if err != nil {
			t.Fatalf("grouped finishing append to %s: %v", id, err)
		}
	}
	if txns := transactions(t, s, "g"); txns != 2 {
		t.Fatalf("the finishing appends of g1-g3 were not grouped: g0-g3 written in %d transactions, want 2", txns)
	}
	exec(t, s.Schema(), `UPDATE {{schema}}.runs SET lease_owner = NULL, lease_expires = NULL`)
	if got := claimed(t, other, []string{"a"}, 10); len(got) != 0 {
		t.Fatalf("a claim after the runs finished took %q", got)
	}
}

// TestReleaseRun: a run given back without a failure or a wait is
// claimable at once (a wait without a failure is the queue contract's);
// with one, its failure is counted and kept and it is claimable
// again only after the retry delay. A run another worker or a driver of
// this store holds is left alone, and so are a finished run, one started
// without an agent and one never written; a negative delay is refused.
func TestReleaseRun(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgstore.Options{})
	other := open(t, pgstore.Options{Schema: s.Schema()})
	t.Run("shutting down", func(t *testing.T) {
		startRun(t, s, "down", "a")
		claimed(t, s, []string{"a"}, 1)
		release := lock(t, s, "down")
		release() // the engine's, before the worker gives the run back
		if err := s.ReleaseRun(ctx, "down", "", 0); err != nil {
			t.Fatal(err)
		}
		info := described(t, s, "down")
		if info.Status != seams.StatusAwaiting || info.Failures != 0 || !info.RetryAt.IsZero() {
			t.Fatalf("given back: %+v; want awaiting, no failure, no retry time", info)
		}
		if got := claimed(t, other, []string{"a"}, 1); !slices.Equal(got, []string{"down"}) {
			t.Fatalf("another worker's claim: %q, want the run at once", got)
		}
		other.ReleaseRun(ctx, "down", "", 0)
	})
	t.Run("failed", func(t *testing.T) {
		startRun(t, s, "fails", "b")
		claimed(t, s, []string{"b"}, 1)
		before := time.Now()
		if err := s.ReleaseRun(ctx, "fails", "model: 503", time.Hour); err != nil {
			t.Fatal(err)
		}
		info := described(t, s, "fails")
		if info.Failures != 1 || info.LastError != "model: 503" || info.Owner != "" || info.Status != seams.StatusAwaiting {
			t.Fatalf("after a failure: %+v", info)
		}
		if d := info.RetryAt.Sub(before); d < time.Hour-time.Second || d > time.Hour+5*time.Second {
			t.Fatalf("retry time %v after the release, want an hour", d)
		}
		if got := claimed(t, other, []string{"b"}, 1); len(got) != 0 {
			t.Fatalf("claimed %q before its retry time", got)
		}
		exec(t, s.Schema(), `UPDATE {{schema}}.runs SET retry_at = now() WHERE run_id = 'fails'`)
		claimed(t, other, []string{"b"}, 1)
		if err := other.ReleaseRun(ctx, "fails", "parameters changed", time.Second); err != nil {
			t.Fatal(err)
		}
		if info := described(t, s, "fails"); info.Failures != 2 || info.LastError != "parameters changed" {
			t.Fatalf("after a second failure: %d failures, last %q", info.Failures, info.LastError)
		}
		if got := claimed(t, s, []string{"b"}, 1); len(got) != 0 {
			t.Fatalf("claimed %q before its retry delay of 1s", got)
		}
		time.Sleep(1100 * time.Millisecond)
		if got := claimed(t, s, []string{"b"}, 1); !slices.Equal(got, []string{"fails"}) {
			t.Fatalf("claim after the retry delay: %q", got)
		}
		if err := s.ReleaseRun(ctx, "fails", "", 0); err != nil {
			t.Fatal(err)
		}
		if info := described(t, s, "fails"); info.Failures != 2 || !info.RetryAt.IsZero() {
			t.Fatalf("given back without a failure: %d failures, retry %v; want the count kept, claimable at once", info.Failures, info.RetryAt)
		}
	})
	t.Run("failure text", func(t *testing.T) {
		startRun(t, s, "text", "c")
		failure := "bad \xff byte, NUL \x00, then " + strings.Repeat("é", 5000)
		if err := s.ReleaseRun(ctx, "text", failure, 0); err != nil {
			t.Fatal(err)
		}
		got := described(t, s, "text").LastError
		if !utf8.ValidString(got) || strings.ContainsRune(got, 0) || len(got) > events.MaxEnvErrorBytes || !strings.HasPrefix(got, "bad \uFFFD byte, NUL \uFFFD, then éé") || !strings.HasSuffix(got, "…") {
			t.Fatalf("kept %d bytes %.40q…, want valid text without NUL cut to %d bytes", len(got), got, events.MaxEnvErrorBytes)
		}
	})
	t.Run("another worker's", func(t *testing.T) {
		startRun(t, s, "theirs", "d")
		claimed(t, other, []string{"d"}, 1)
		if err := s.ReleaseRun(ctx, "theirs", "boom", time.Hour); err != nil {
			t.Fatal(err)
		}
		if info := described(t, s, "theirs"); info.Owner != other.Owner() || info.Failures != 0 || info.LastError != "" {
			t.Fatalf("a run another worker holds, after this one gave it back: %+v", info)
		}
	})
	t.Run("finished", func(t *testing.T) {
		tail := startRun(t, s, "done", "e")
		finishRun(t, s, "done", tail)
		if err := s.ReleaseRun(ctx, "done", "boom", 0); err != nil {
			t.Fatal(err)
		}
		if info := described(t, s, "done"); info.Failures != 0 || info.Status != seams.StatusFinished {
			t.Fatalf("a finished run given back: %+v", info)
		}
	})
	t.Run("a driver of this store's", func(t *testing.T) {
		startRun(t, s, "driven", "f")
		claimed(t, s, []string{"f"}, 1)
		release := lock(t, s, "driven")
		if err := s.ReleaseRun(ctx, "driven", "boom", 0); err != nil {
			t.Fatal(err)
		}
		if info := described(t, s, "driven"); info.Owner != s.Owner() || info.Failures != 0 {
			t.Fatalf("a run a driver of this store holds, after the store gave it back: %+v", info)
		}
		release()
		if err := s.ReleaseRun(ctx, "driven", "boom", 0); err != nil {
			t.Fatal(err)
		}
		if info := described(t, s, "driven"); info.Owner != "" || info.Failures != 1 {
			t.Fatalf("given back after its driver's release: %+v", info)
		}
	})
	t.Run("refused", func(t *testing.T) {
		if err := s.ReleaseRun(ctx, "never written", "boom", 0); err != nil {
			t.Errorf("a run never written: %v, want nothing done", err)
		}
		startRun(t, s, "negative", "g")
		err := s.ReleaseRun(ctx, "negative", "boom", -time.Second)
		if err == nil || !strings.Contains(err.Error(), "retry delay -1s is negative") {
			t.Errorf("a negative delay: %v", err)
		}
		if info := described(t, s, "negative"); info.Failures != 0 {
			t.Errorf("the refused release wrote: %+v", info)
		}
	})
	t.Run("a run without an agent", func(t *testing.T) {
		startRun(t, s, "plain", "")
		if err := s.ReleaseRun(ctx, "plain", "boom", time.Hour); err != nil {
			t.Fatal(err)
		}
		if info := described(t, s, "plain"); info.Failures != 0 || info.LastError != "" || !info.RetryAt.IsZero() {
			t.Errorf("a run no worker claims, given back: %+v, want nothing recorded", info)
		}
	})
}

// TestRequeueRun: an operator's resume clears a run's retry time, failure
// count, last error and a holder whose lease ran out, so workers claim it
// at once; it refuses, writing nothing, a run the store does not hold, a
// finished run, a run without an agent and a run a live driver holds.
func TestRequeueRun(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgstore.Options{})
	other := open(t, pgstore.Options{Schema: s.Schema()})
	tail := startRun(t, s, "finished", "a")
	finishRun(t, s, "finished", tail)
	startRun(t, s, "no agent", "")
	startRun(t, s, "held", "a")
	lock(t, other, "held")
	exec(t, s.Schema(), `UPDATE {{schema}}.runs SET failures = 2, last_error = 'kept', retry_at = now() + interval '1 day'`)
	for _, c := range []struct {
		run  string
		want error
		says string
	}{
		{"never written", seams.ErrNoRun, ""},
		{"finished", seams.ErrRunFinished, ""},
		{"no agent", seams.ErrNotQueued, ""},
		{"held", seams.ErrRunLocked, other.Owner()},
	} {
		var before seams.RunInfo
		if c.want != seams.ErrNoRun {
			before = described(t, s, c.run)
		}
		err := s.RequeueRun(ctx, c.run)
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("requeue of %s: %v, want %v naming %q", c.run, err, c.want, c.says)
		}
		switch c.want {
		case seams.ErrNoRun:
		case seams.ErrRunFinished: // listed without queue state: read the row
			if failures, lastError := failuresOf(t, s, c.run); failures != 2 || lastError != "kept" {
				t.Errorf("the refused requeue of %s changed its row: %d failures, last error %q", c.run, failures, lastError)
			}
		default:
			if after := described(t, s, c.run); after.Owner != before.Owner || after.Failures != 2 || after.LastError != "kept" || !after.RetryAt.Equal(before.RetryAt) {
				t.Errorf("the refused requeue of %s changed it: %+v, was %+v", c.run, after, before)
			}
		}
	}

	startRun(t, s, "stuck", "a")
	exec(t, s.Schema(), `UPDATE {{schema}}.runs SET failures = 3, last_error = 'boom', retry_at = now() + interval '1 day',
	lease_owner = 'dead', lease_expires = now() - interval '1 minute' WHERE run_id = 'stuck'`)
	if info := described(t, s, "stuck"); info.Status != seams.StatusInterrupted || info.Owner != "dead" {
		t.Fatalf("before the requeue: %+v", info)
	}
	if err := s.RequeueRun(ctx, "stuck"); err != nil {
		t.Fatal(err)
	}
	info := described(t, s, "stuck")
	if info.Status != seams.StatusAwaiting || info.Owner != "" || !info.LeaseExpires.IsZero() || info.Failures != 0 || info.LastError != "" || !info.RetryAt.IsZero() {
		t.Fatalf("after the requeue: %+v; want awaiting, its holder, failures and retry time cleared", info)
	}
	if got := claimed(t, other, []string{"a"}, 10); !slices.Equal(got, []string{"stuck"}) {
		t.Fatalf("claim after the requeue: %q", got)
	}
}

// failuresOf is run id's failures and last_error columns, read from its
// row (a listing shows none for a finished run).
func failuresOf(t *testing.T, s *pgstore.Store, id string) (failures int, lastError string) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var text *string
	err = conn.QueryRow(context.Background(), `SELECT failures, last_error FROM `+pgx.Identifier{s.Schema(), "runs"}.Sanitize()+
		` WHERE run_id = $1`, id).Scan(&failures, &text)
	if err != nil {
		t.Fatal(err)
	}
	if text != nil {
		lastError = *text
	}
	return failures, lastError
}

// withoutServer runs fn while the runs table is locked against every
// statement (ACCESS EXCLUSIVE, by a session of the test's own), with a
// context that ends after a second: what fn asks the server times out.
func withoutServer(t *testing.T, s *pgstore.Store, fn func(ctx context.Context)) {
	t.Helper()
	conn, _ := holding(t, `LOCK TABLE `+pgx.Identifier{s.Schema(), "runs"}.Sanitize()+` IN ACCESS EXCLUSIVE MODE`)
	defer conn.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	fn(ctx)
}

// cancelBy is the requester of runID's cancel request as s answers it, ""
// for none.
func cancelBy(t *testing.T, ctx context.Context, s *pgstore.Store, runID string) string {
	t.Helper()
	c, err := s.CancelRequested(ctx, runID)
	if err != nil {
		t.Fatalf("CancelRequested(%s): %v", runID, err)
	}
	if c == nil {
		return ""
	}
	return c.By
}

// TestCancelRequests: a request is durable, the first one stays, and it
// names the run's live holder (nobody once its lease ran out); a run the
// store does not hold and a finished run are refused, writing nothing.
func TestCancelRequests(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgstore.Options{})
	other := open(t, pgstore.Options{Schema: s.Schema()})

	startRun(t, s, "queued", "a")
	if holder, err := s.RequestCancel(ctx, "queued", "ops"); err != nil || holder != "" {
		t.Fatalf("request for a run nobody holds: holder %q, %v", holder, err)
	}
	first, err := other.CancelRequested(ctx, "queued")
	if err != nil || first == nil || first.By != "ops" || first.At.IsZero() {
		t.Fatalf("the request as another store reads it: %+v, %v", first, err)
	}
	if _, err := other.RequestCancel(ctx, "queued", "later"); err != nil {
		t.Fatal(err)
	}
	same := func(c *seams.CancelRequest) bool { return c != nil && c.By == first.By && c.At.Equal(first.At) }
	if again, _ := s.CancelRequested(ctx, "queued"); !same(again) {
		t.Fatalf("after a second request: %+v, want the first %+v", again, first)
	}
	if info := described(t, s, "queued"); !same(info.CancelRequested) {
		t.Fatalf("Describe: %+v", info.CancelRequested)
	}

	startRun(t, s, "held", "a")
	lock(t, other, "held")
	if holder, err := s.RequestCancel(ctx, "held", "ops"); err != nil || holder != other.Owner() {
		t.Fatalf("request for a held run: holder %q, %v; want %s", holder, err, other.Owner())
	}
	startRun(t, s, "expired", "a")
	exec(t, s.Schema(), `UPDATE {{schema}}.runs SET lease_owner = 'dead', lease_expires = now() - interval '1 second' WHERE run_id = 'expired'`)
	if holder, err := s.RequestCancel(ctx, "expired", "ops"); err != nil || holder != "" {
		t.Fatalf("request for a run whose holder's lease ran out: holder %q, %v; want nobody", holder, err)
	}

	tail := startRun(t, s, "finished", "a")
	finishRun(t, s, "finished", tail)
	if _, err := s.RequestCancel(ctx, "finished", "ops"); !errors.Is(err, seams.ErrRunFinished) {
		t.Fatalf("request for a finished run: %v", err)
	}
	if _, err := s.RequestCancel(ctx, "never", "ops"); !errors.Is(err, seams.ErrNoRun) {
		t.Fatalf("request for a run never written: %v", err)
	}
	exec(t, s.Schema(), `DO $$ BEGIN IF EXISTS (SELECT 1 FROM {{schema}}.runs WHERE run_id = 'finished' AND cancel_by IS NOT NULL) THEN RAISE 'the refused request was written'; END IF; END $$`)
	if by := cancelBy(t, ctx, s, "never"); by != "" {
		t.Fatalf("a run never written has a request by %q", by)
	}
	for _, c := range []struct{ by, says string }{
		{"bad\x00name", "not valid UTF-8 without NUL"},
		{"bad \xff byte", "not valid UTF-8 without NUL"},
		{strings.Repeat("x", pgstore.MaxCancelByBytes+1), "more than 1024"},
	} {
		if _, err := s.RequestCancel(ctx, "held", c.by); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("request by %.20q: %v, want an error saying %q", c.by, err, c.says)
		}
	}
}

// TestCancelRequestedOfAHeldRunCostsNoRoundTrip: for a run it holds, a
// store answers CancelRequested from what taking the run, its last append
// (alone or grouped) or its last renewal read back, and from what a
// request through itself recorded: with every statement on the runs table
// blocked, it still answers.
func TestCancelRequestedOfAHeldRunCostsNoRoundTrip(t *testing.T) {
	ctx := context.Background()
	const term = 1500 * time.Millisecond
	s := open(t, pgstore.Options{MaxConns: 4, LeaseDuration: term})
	ops := open(t, pgstore.Options{Schema: s.Schema()})
	tails := map[string]ulid.ULID{}
	for _, id := range []string{"taken", "appended", "first", "g0", "g1", "g2", "renewed", "own"} {
		tails[id] = startRun(t, s, id, "a")
	}

	// Taken: a request recorded before LockRun.
	if _, err := ops.RequestCancel(ctx, "taken", "ops"); err != nil {
		t.Fatal(err)
	}
	lock(t, s, "taken")
	withoutServer(t, s, func(ctx context.Context) {
		if by := cancelBy(t, ctx, s, "taken"); by != "ops" {
			t.Errorf("after LockRun: request by %q, want ops", by)
		}
	})

	// Appended alone: a request recorded before the append committed.
	lock(t, s, "appended")
	if _, err := ops.RequestCancel(ctx, "appended", "ops"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, "appended", tails["appended"], proptest.SoundStream("appended")[2]); err != nil {
		t.Fatal(err)
	}
	withoutServer(t, s, func(ctx context.Context) {
		if by := cancelBy(t, ctx, s, "appended"); by != "ops" {
			t.Errorf("after an append: request by %q, want ops", by)
		}
	})

	// Appended in a group: the continuations' one statement.
	for _, id := range []string{"first", "g0", "g1", "g2"} {
		lock(t, s, id)
		if _, err := ops.RequestCancel(ctx, id, "ops-"+id); err != nil {
			t.Fatal(err)
		}
	}
	for id, err := range groupOf(t, s, "first", tails, "g0", "g1", "g2") {
		if err != nil {
			t.Fatalf("grouped append to %s: %v", id, err)
		}
	}
	withoutServer(t, s, func(ctx context.Context) {
		for _, id := range []string{"first", "g0", "g1", "g2"} {
			if by := cancelBy(t, ctx, s, id); by != "ops-"+id {
				t.Errorf("after a grouped append: %s's request by %q, want ops-%s", id, by, id)
			}
		}
	})

	// Renewed: a run waiting on its model appends nothing; its renewal
	// reads the request back.
	lock(t, s, "renewed")
	if _, err := ops.RequestCancel(ctx, "renewed", "ops"); err != nil {
		t.Fatal(err)
	}
	// (For a run it holds, the store answers from its lease, request or
	// not: polling asks the server nothing.)
	waitFor(t, "the renewal to read the request", func() bool { return cancelBy(t, ctx, s, "renewed") == "ops" })
	withoutServer(t, s, func(ctx context.Context) {
		if by := cancelBy(t, ctx, s, "renewed"); by != "ops" {
			t.Errorf("after a renewal: request by %q, want ops", by)
		}
	})

	// Through the store itself: at once.
	lock(t, s, "own")
	withoutServer(t, s, func(ctx context.Context) {
		if by := cancelBy(t, ctx, s, "own"); by != "" {
			t.Errorf("before any request: request by %q", by)
		}
	})
	if holder, err := s.RequestCancel(ctx, "own", "me"); err != nil || holder != s.Owner() {
		t.Fatalf("request through the holder: %q, %v", holder, err)
	}
	withoutServer(t, s, func(ctx context.Context) {
		if by := cancelBy(t, ctx, s, "own"); by != "me" {
			t.Errorf("after a request through the holding store: request by %q, want me", by)
		}
	})
}

// TestListingsShowLiveness: Runs and Describe give every run its
// coordination — agent, holder (the last one's owner and expiry even
// once it ran out), failures, retry time, cancel request — and its
// liveness by the server's clock: running, awaiting, interrupted (a
// holder's lease ran out; a run without an agent nobody holds), finished
// (with no coordination: it left the queue), corrupt.
func TestListingsShowLiveness(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgstore.Options{})
	worker := open(t, pgstore.Options{Schema: s.Schema()})
	cases := []struct {
		id, agent string
		setup     func(id string, tail ulid.ULID)
		status    seams.RunStatus
		owner     string
		check     func(info seams.RunInfo) bool
	}{
		{"held", "a", func(id string, _ ulid.ULID) { lock(t, worker, id) }, seams.StatusRunning, worker.Owner(),
			func(i seams.RunInfo) bool { return i.LeaseExpires.After(time.Now()) }},
		{"held without an agent", "", func(id string, _ ulid.ULID) { lock(t, worker, id) }, seams.StatusRunning, worker.Owner(), nil},
		{"queued", "a", nil, seams.StatusAwaiting, "", nil},
		{"failed", "a", func(id string, _ ulid.ULID) {
			claimed(t, worker, []string{"a"}, 10)
			if err := worker.ReleaseRun(ctx, id, "boom", time.Hour); err != nil {
				t.Fatal(err)
			}
			if err := worker.ReleaseRun(ctx, "queued", "", 0); err != nil {
				t.Fatal(err)
			}
			if _, err := s.RequestCancel(ctx, id, "ops"); err != nil {
				t.Fatal(err)
			}
		}, seams.StatusAwaiting, "", func(i seams.RunInfo) bool {
			return i.Failures == 1 && i.LastError == "boom" && i.RetryAt.After(time.Now()) && i.CancelRequested != nil && i.CancelRequested.By == "ops"
		}},
		{"holder died", "a", func(id string, _ ulid.ULID) {
			exec(t, s.Schema(), `UPDATE {{schema}}.runs SET lease_owner = 'dead-worker', lease_expires = now() - interval '1 minute' WHERE run_id = $1`, id)
		}, seams.StatusInterrupted, "dead-worker", func(i seams.RunInfo) bool { return i.LeaseExpires.Before(time.Now()) }},
		{"driver stopped", "", nil, seams.StatusInterrupted, "", nil},
		{"finished", "a", func(id string, tail ulid.ULID) {
			if _, err := s.RequestCancel(ctx, id, "ops"); err != nil {
				t.Fatal(err)
			}
			finishRun(t, s, id, tail)
		}, seams.StatusFinished, "", func(i seams.RunInfo) bool { return i.CancelRequested == nil }},
		{"damaged", "a", func(id string, _ ulid.ULID) {
			exec(t, s.Schema(), `UPDATE {{schema}}.runs SET steps = steps + 1 WHERE run_id = $1`, id)
		}, seams.StatusCorrupt, "", nil},
	}
	for _, c := range cases {
		tail := startRun(t, s, c.id, c.agent)
		if c.setup != nil {
			c.setup(c.id, tail)
		}
	}
	runs, err := s.Runs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]seams.RunInfo{}
	for _, r := range runs {
		listed[r.RunID] = r
	}
	for _, c := range cases {
		d := described(t, s, c.id)
		agent := c.agent
		if c.status == seams.StatusFinished {
			agent = "" // it left the queue: no worker pool claims it
		}
		for how, info := range map[string]seams.RunInfo{"Runs": listed[c.id], "Describe": d} {
			if info.Status != c.status || info.Agent != agent || info.Owner != c.owner || c.check != nil && !c.check(info) {
				t.Errorf("%s of %s: %+v; want %s, agent %q, owner %q", how, c.id, info, c.status, agent, c.owner)
			}
		}
	}
	if _, err := s.Describe(ctx, "never"); !errors.Is(err, seams.ErrNoRun) {
		t.Errorf("Describe of a run never written: %v", err)
	}
	exec(t, s.Schema(), `DELETE FROM {{schema}}.runs WHERE run_id = 'queued'`)
	if info := described(t, s, "queued"); info.Status != seams.StatusCorrupt {
		t.Errorf("Describe of a run whose events have no index row: %+v", info)
	}
}

// TestAClaimReadsOnlyUnfinishedRuns: beside 100,000 finished runs, 20,000
// queued runs of another agent and 5,000 of its own agent's runs that live
// workers hold, a claim — planned as the store's sessions plan it (a
// generic plan), with the table analysed or not yet — reads the claimable
// ranges of the partial index, never the table's other rows: it touches a
// few pages, not the thousands the other rows fill. (Those rows are
// written by SQL, as such runs' rows look, for speed; BenchmarkClaim
// writes real finished runs.)
func TestAClaimReadsOnlyUnfinishedRuns(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgstore.Options{})
	exec(t, s.Schema(), `INSERT INTO {{schema}}.runs (run_id, status, steps, events, stop_reason, first_event, last_event, last_id, crc, agent)
SELECT 'f' || i, 'finished', 1, 5, 'agent_finished', now() - interval '1 day', now() - interval '1 day',
	decode(lpad(to_hex(i), 32, '0'), 'hex'), 0, 'a'
FROM generate_series(1, 100000) AS i`)
	// Unfinished runs a claim for agent a must not read either: another
	// agent's queue, and a's runs that live workers hold.
	exec(t, s.Schema(), `INSERT INTO {{schema}}.runs (run_id, status, steps, events, stop_reason, first_event, last_event, last_id, crc, agent)
SELECT 'b' || i, 'running', 1, 5, '', now(), now(), decode(lpad(to_hex(i), 32, '0'), 'hex'), 0, 'b'
FROM generate_series(1, 20000) AS i`)
	exec(t, s.Schema(), `INSERT INTO {{schema}}.runs (run_id, status, steps, events, stop_reason, first_event, last_event, last_id, crc, agent, lease_owner, lease_expires)
SELECT 'h' || i, 'running', 1, 5, '', now(), now(), decode(lpad(to_hex(i), 32, '0'), 'hex'), 0, 'a', 'live-worker', now() + interval '1 hour'
FROM generate_series(1, 5000) AS i`)
	for i := range 10 {
		startRun(t, s, fmt.Sprintf("q%d", i), "a")
	}
	conn, err := pgx.Connect(ctx, pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `PREPARE claim(text[], int, text, bigint, text[]) AS `+pgstore.ClaimSQL(s)); err != nil {
		t.Fatal(err)
	}
	for _, analysed := range []bool{false, true} {
		if analysed {
			exec(t, s.Schema(), `ANALYZE {{schema}}.runs`)
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var plan []struct{ Plan planNode }
		err = tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE claim(ARRAY['a'], 1, 'explainer', 1000000, ARRAY[]::text[])`).Scan(&plan)
		tx.Rollback(ctx)
		if err != nil || len(plan) != 1 {
			t.Fatalf("explain: %v", err)
		}
		top := plan[0].Plan
		var indexes, seqScans []string
		top.walk(func(n planNode) {
			if n.IndexName != "" {
				indexes = append(indexes, n.IndexName)
			}
			if n.NodeType == "Seq Scan" && n.RelationName == "runs" {
				seqScans = append(seqScans, n.RelationName)
			}
		})
		if !slices.Contains(indexes, "runs_claimable") || len(seqScans) > 0 || top.ActualRows != 1 {
			t.Errorf("analysed %v: the claim's plan claims %v rows, uses indexes %q and scans runs whole %d times; want one run, from runs_claimable, no scan", analysed, top.ActualRows, indexes, len(seqScans))
		}
		if pages := top.SharedHitBlocks + top.SharedReadBlocks; pages > 64 {
			t.Errorf("analysed %v: the claim touched %d pages; the 10 unfinished runs fill a few", analysed, pages)
		}
	}
}

// planNode is a node of EXPLAIN's JSON.
type planNode struct {
	NodeType         string     `json:"Node Type"`
	RelationName     string     `json:"Relation Name"`
	IndexName        string     `json:"Index Name"`
	ActualRows       float64    `json:"Actual Rows"`
	SharedHitBlocks  int        `json:"Shared Hit Blocks"`
	SharedReadBlocks int        `json:"Shared Read Blocks"`
	Plans            []planNode `json:"Plans"`
}

func (n planNode) walk(fn func(planNode)) {
	fn(n)
	for _, c := range n.Plans {
		c.walk(fn)
	}
}

// BenchmarkClaim: one worker's claim of one run and its release, beside
// 10 unfinished runs of the agent and 100 or 100,000 finished ones
// (written by real appends of run streams, many at once so they group):
// a claim costs what the unfinished runs cost, whatever the finished.
func BenchmarkClaim(b *testing.B) {
	for _, finished := range []int{100, 100_000} {
		b.Run(fmt.Sprintf("finished=%d", finished), func(b *testing.B) {
			ctx := context.Background()
			s := open(b, pgstore.Options{})
			var (
				next atomic.Int64
				wg   sync.WaitGroup
			)
			for range 64 {
				wg.Go(func() {
					for i := next.Add(1); i <= int64(finished) && !b.Failed(); i = next.Add(1) {
						id := fmt.Sprintf("f%06d", i)
						started := proptest.SoundStream(id)[0].(events.RunStarted)
						started.Agent = "a"
						if _, err := s.Append(ctx, id, ulid.ULID{}, append([]events.Event{started}, proptest.FailedModelCall(id, 0)...)...); err != nil {
							b.Error(err)
						}
					}
				})
			}
			wg.Wait()
			for i := range 10 {
				startRun(b, s, fmt.Sprintf("q%d", i), "a")
			}
			exec(b, s.Schema(), `VACUUM ANALYZE {{schema}}.runs`)
			agents := []string{"a"}
			for b.Loop() {
				claims, err := s.ClaimRuns(ctx, agents, 1)
				if err != nil || len(claims) != 1 {
					b.Fatalf("claim: %v, %v", claims, err)
				}
				if err := s.ReleaseRun(ctx, claims[0].RunID, "", 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestAClaimSkipsARunItsStoreIsLettingGoOf: between a release giving a
// run's lease back on the server and the store forgetting its hold, a
// claim by the same store would take a run it cannot lock (the drive
// finds it busy, and the claim's lease stands a whole term); the claim
// passes it over until the hold is forgotten.
func TestAClaimSkipsARunItsStoreIsLettingGoOf(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgstore.Options{})
	startRun(t, s, "r", "a")
	release, err := s.LockRun("r")
	if err != nil {
		t.Fatal(err)
	}
	pgstore.LetGo(s, "r")
	exec(t, s.Schema(), `UPDATE {{schema}}.runs SET lease_owner = NULL, lease_expires = NULL WHERE run_id = 'r'`)
	if claims, err := s.ClaimRuns(ctx, []string{"a"}, 10); err != nil || len(claims) != 0 {
		t.Fatalf("a claim while the store lets the run go: %v %v, want nothing", claims, err)
	}
	release()
	if claims, err := s.ClaimRuns(ctx, []string{"a"}, 10); err != nil || len(claims) != 1 || claims[0].RunID != "r" {
		t.Fatalf("a claim once the hold is forgotten: %v %v, want r", claims, err)
	}
}
