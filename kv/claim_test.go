package kv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// claimIDs claims up to max runs of agents and returns their ids, checking
// each claim names the agent its run was started for.
func claimIDs(t *testing.T, s *Store, max int, agents ...string) []string {
	t.Helper()
	claims, err := s.ClaimRuns(context.Background(), agents, max)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range claims {
		if i := strings.Index(c.RunID, "-"); i > 0 && c.Agent != c.RunID[:i] {
			t.Errorf("claim %+v: want agent %q (the run id's prefix)", c, c.RunID[:i])
		}
		ids = append(ids, c.RunID)
	}
	return ids
}

// TestClaimTakesOnlyClaimableRuns: a claim takes the runs of the named
// agents that are queued, unfinished, past their retry time and held by
// nobody — never claimed, or claimed by an Open that has ended — and none
// other. Run ids lead with their agent's name (claimIDs checks each
// claim's agent by it).
func TestClaimTakesOnlyClaimableRuns(t *testing.T) {
	s := openQueueStore(t, formatLog)
	ctx := context.Background()
	submitRun(t, s, "alpha-ended", "alpha")
	if got := claimIDs(t, s, 1, "alpha"); !slices.Equal(got, []string{"alpha-ended"}) {
		t.Fatalf("claimed %q", got)
	}
	s = reopen(t, s, Options{}) // the claim above is now an ended Open's

	for _, c := range []struct {
		run       string
		claimable bool
		setup     func(t *testing.T, run string)
	}{
		{"alpha-ended", true, nil},
		{"alpha-queued", true, func(t *testing.T, run string) { submitRun(t, s, run, "alpha") }},
		{"beta-queued", true, func(t *testing.T, run string) { submitRun(t, s, run, "beta") }},
		{"gamma-queued", false, func(t *testing.T, run string) { submitRun(t, s, run, "gamma") }}, // not named
		{"alpha-given-back", true, func(t *testing.T, run string) {
			submitRun(t, s, run, "alpha")
			claimExactly(t, s, run)
			if err := s.ReleaseRun(ctx, run, "", 0); err != nil {
				t.Fatal(err)
			}
		}},
		{"plain", false, func(t *testing.T, run string) { submitRun(t, s, run, "") }},
		{"alpha-finished", false, func(t *testing.T, run string) { finishRun(t, s, run, submitRun(t, s, run, "alpha")) }},
		{"alpha-held", false, func(t *testing.T, run string) {
			submitRun(t, s, run, "alpha")
			release, err := s.LockRun(run)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(release)
		}},
		{"alpha-claimed", false, func(t *testing.T, run string) {
			submitRun(t, s, run, "alpha")
			claimExactly(t, s, run)
		}},
		{"alpha-waiting", false, func(t *testing.T, run string) {
			submitRun(t, s, run, "alpha")
			claimExactly(t, s, run)
			if err := s.ReleaseRun(ctx, run, "it failed", time.Hour); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		if c.setup != nil {
			c.setup(t, c.run)
		}
		// Claim everything claimable now, one run at a time, and give the
		// others back, so each row is claimed on its own.
		got := claimIDs(t, s, 100, "alpha", "beta")
		if claimed := slices.Contains(got, c.run); claimed != c.claimable {
			t.Errorf("%s: claimed %t, want %t (claimed %q)", c.run, claimed, c.claimable, got)
		}
		for _, id := range got {
			if id != c.run {
				t.Errorf("%s: the claim also took %s", c.run, id)
			}
		}
	}
}

// claimExactly claims run, which must be the only claimable run of its
// agent.
func claimExactly(t *testing.T, s *Store, run string) {
	t.Helper()
	if got := claimIDs(t, s, 100, strings.SplitN(run, "-", 2)[0]); !slices.Equal(got, []string{run}) {
		t.Fatalf("claimed %q, want %s alone", got, run)
	}
}

// TestClaimTakesAtMostMaxInRunIDOrder: a claim takes at most max runs,
// in run id order; nothing when no agent is named or max is under 1; an
// agent name seams.ValidAgent refuses is an error. A claim that finds
// nothing commits no transaction.
func TestClaimTakesAtMostMaxInRunIDOrder(t *testing.T) {
	s := openQueueStore(t, formatLog)
	ctx := context.Background()
	for i := range 5 {
		submitRun(t, s, fmt.Sprintf("alpha-%d", i), "alpha")
	}
	for _, max := range []int{0, -1} {
		if got := claimIDs(t, s, max, "alpha"); len(got) != 0 {
			t.Errorf("max %d: claimed %q", max, got)
		}
	}
	if got := claimIDs(t, s, 5); len(got) != 0 {
		t.Errorf("no agent named: claimed %q", got)
	}
	for _, bad := range []string{"", strings.Repeat("a", seams.MaxAgentBytes+1), "a\nb"} {
		if _, err := s.ClaimRuns(ctx, []string{"alpha", bad}, 5); !errors.Is(err, seams.ErrInvalidAgent) {
			t.Errorf("agent %.20q: got %v, want ErrInvalidAgent", bad, err)
		}
	}
	for _, want := range [][]string{{"alpha-0", "alpha-1"}, {"alpha-2", "alpha-3"}, {"alpha-4"}, nil} {
		if got := claimIDs(t, s, 2, "alpha"); !slices.Equal(got, want) {
			t.Errorf("claimed %q, want %q", got, want)
		}
	}
	before := s.Transactions()
	claimIDs(t, s, 2, "alpha")
	if n := s.Transactions() - before; n != 0 {
		t.Errorf("a claim that found nothing committed %d transactions", n)
	}
}

// TestTwoClaimersNeverGetTheSameRun: claimers racing over the same queue
// take every run once; and a driver racing them never sees a run it holds
// claimed meanwhile. A run the driver took from a claim's worker is
// nobody's once the driver lets go, so it may be claimed once more.
func TestTwoClaimersNeverGetTheSameRun(t *testing.T) {
	s := openQueueStore(t, formatLog)
	const runs, claimers = 120, 6
	for i := range runs {
		submitRun(t, s, fmt.Sprintf("alpha-%03d", i), "alpha")
	}
	var (
		mu      sync.Mutex
		claimed = map[string]int{}
		wg      sync.WaitGroup
		errs    = make(chan error, claimers+1)
	)
	for range claimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range runs { // enough rounds to take every run, were each claim to take one
				claims, err := s.ClaimRuns(context.Background(), []string{"alpha"}, 3)
				if err != nil {
					errs <- err
					return
				}
				if len(claims) == 0 {
					return
				}
				mu.Lock()
				for _, c := range claims {
					claimed[c.RunID]++
				}
				mu.Unlock()
			}
		}()
	}
	held, claimedFirst := map[string]bool{}, map[string]bool{}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < runs; i += 7 {
			run := fmt.Sprintf("alpha-%03d", i)
			release, err := s.LockRun(run)
			if err != nil {
				continue // a claim holds it for the moment
			}
			held[run] = true
			before := claimOwner(t, s, run)
			claimedFirst[run] = before != ""
			time.Sleep(time.Millisecond)
			if after := claimOwner(t, s, run); before == "" && after != "" {
				errs <- fmt.Errorf("%s was claimed while a driver held it", run)
			}
			release()
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := range runs {
		run := fmt.Sprintf("alpha-%03d", i)
		n := claimed[run]
		if !held[run] && n != 1 || held[run] && (n > 2 || n == 2 && !claimedFirst[run]) {
			t.Errorf("%s claimed %d times (taken by the driver: %v, after a claim: %v)", run, n, held[run], claimedFirst[run])
		}
	}
}

// claimOwner is the owner run's queue entry names.
func claimOwner(t *testing.T, s *Store, run string) string {
	var owner string
	s.db.View(func(tx *bolt.Tx) error {
		if q, err := readQueued(tx, run); err == nil && q != nil {
			owner = q.Owner
		}
		return nil
	})
	return owner
}

// TestAClaimedRunIsTheClaimersToDrive: the Store that claimed a run takes
// it with LockRun; a second driver is refused while the first holds it;
// until a driver takes it, and while one holds it, listings say this
// Store holds it, with no expiry, and no claim takes it again; once the
// driver lets go nobody holds it (awaiting) and it is claimable again,
// though the file still names this Store until ReleaseRun. Once that
// Store is closed, the next Open lists a claim left in the file as an
// ended Open's — its LeaseExpires the moment the new Store was opened, so
// interrupted — and claims the run at once.
func TestAClaimedRunIsTheClaimersToDrive(t *testing.T) {
	s := openQueueStore(t, formatLog)
	submitRun(t, s, "alpha-r", "alpha")
	claimExactly(t, s, "alpha-r")
	held := func(when string) {
		t.Helper()
		if got := claimIDs(t, s, 5, "alpha"); len(got) != 0 {
			t.Errorf("%s: a claimed run was claimed again: %q", when, got)
		}
		for how, info := range map[string]RunInfo{"Describe": describeRun(t, s, "alpha-r"), "Runs": listed(t, s, "alpha-r")} {
			if info.Status != seams.StatusRunning || info.Owner != s.Owner() || !info.LeaseExpires.IsZero() {
				t.Errorf("%s: %s: %+v, want running, owner %s, no expiry", when, how, info, s.Owner())
			}
		}
	}
	held("claimed")
	release, err := s.LockRun("alpha-r")
	if err != nil {
		t.Fatalf("the claimer's LockRun: %v", err)
	}
	if _, err := s.LockRun("alpha-r"); !errors.Is(err, seams.ErrRunLocked) {
		t.Errorf("a second driver's LockRun: %v, want ErrRunLocked", err)
	}
	held("driven")
	release()
	if info := describeRun(t, s, "alpha-r"); info.Status != seams.StatusAwaiting || info.Owner != "" || claimOwner(t, s, "alpha-r") != s.Owner() {
		t.Errorf("after its driver let go: %+v, file naming %q; want awaiting, held by nobody, the file naming this Store", info, claimOwner(t, s, "alpha-r"))
	}
	claimExactly(t, s, "alpha-r")

	ended := s.Owner()
	s = reopen(t, s, Options{})
	if s.Owner() == ended {
		t.Fatalf("two Opens share the owner %q", ended)
	}
	for how, info := range map[string]RunInfo{"Describe": describeRun(t, s, "alpha-r"), "Runs": listed(t, s, "alpha-r")} {
		if info.Status != seams.StatusInterrupted || info.Owner != ended || !info.LeaseExpires.Equal(s.opened) {
			t.Errorf("%s of a run an ended Open claimed: %+v, want interrupted, owner %s, lease expired at %v", how, info, ended, s.opened)
		}
	}
	r := reopen(t, s, Options{ReadOnly: true})
	if info := describeRun(t, r, "alpha-r"); info.Status != seams.StatusInterrupted || info.Owner != ended {
		t.Errorf("read-only: %+v, want interrupted, owner %s", info, ended)
	}
	s = reopen(t, r, Options{})
	claimExactly(t, s, "alpha-r")
}

// TestReleaseRunGivesARunBack: a worker gives back a run it claimed; with
// a failure the run waits for its retry time, and its failure count and
// last error say why; without one it is claimable once its retry time
// comes — at once for none, its retry time cleared; later for a run that
// waits for a decision, its failures kept (a table of releases, each
// after a claim). A run no worker claims is left alone.
func TestReleaseRunGivesARunBack(t *testing.T) {
	s := openQueueStore(t, formatLog)
	ctx := context.Background()
	now := time.Now()
	s.clock = func() time.Time { return now }
	submitRun(t, s, "alpha-r", "alpha")
	long := strings.Repeat("é", maxLastError)
	var retryAt time.Time
	for _, c := range []struct {
		name      string
		failure   string
		retry     time.Duration
		failures  int
		lastError string
	}{
		{"shutting down", "", 0, 0, ""},
		{"waiting for a decision", "", time.Hour, 0, ""},
		{"failed", "model unreachable", time.Minute, 1, "model unreachable"},
		{"failed again, no wait", "parameters changed", 0, 2, "parameters changed"},
		{"shutting down after failures", "", 0, 2, "parameters changed"},
		{"waiting after failures", "", time.Hour, 2, "parameters changed"},
		{"failed at length", long, time.Second, 3, long[:maxLastError-len(" … (cut)")] + " … (cut)"},
	} {
		claimExactly(t, s, "alpha-r")
		if err := s.ReleaseRun(ctx, "alpha-r", c.failure, c.retry); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		retryAt = time.Time{} // without a failure or a wait: claimable at once
		if c.failure != "" || c.retry > 0 {
			retryAt = now.Add(c.retry)
		}
		info := describeRun(t, s, "alpha-r")
		if info.Status != seams.StatusAwaiting || info.Owner != "" || info.Failures != c.failures || info.LastError != c.lastError || !info.RetryAt.Equal(retryAt) {
			t.Errorf("%s: %+v, want awaiting, %d failures, last error %.30q, retry at %v", c.name, info, c.failures, c.lastError, retryAt)
		}
		if !utf8.ValidString(info.LastError) {
			t.Errorf("%s: the last error is cut inside a character", c.name)
		}
		if retryAt.After(now) {
			if got := claimIDs(t, s, 1, "alpha"); len(got) != 0 {
				t.Errorf("%s: claimed before its retry time", c.name)
			}
			now = retryAt // the clock reaches the retry time
		}
	}
	claimExactly(t, s, "alpha-r")
	release, err := s.LockRun("alpha-r")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseRun(ctx, "alpha-r", "boom", 0); err != nil {
		t.Fatal(err)
	}
	if info := describeRun(t, s, "alpha-r"); info.Owner != s.Owner() || info.Failures != 3 {
		t.Errorf("a release while a driver of this process holds the run changed it: %+v", info)
	}
	release()
	before := s.Transactions()
	if err := s.ReleaseRun(ctx, "alpha-r", "boom", -time.Second); err == nil || !strings.Contains(err.Error(), "negative") {
		t.Errorf("a negative retry: %v, want an error saying so", err)
	}
	if n := s.Transactions() - before; n != 0 {
		t.Errorf("a refused release committed %d transactions", n)
	}
	for _, run := range []string{"never-written", "plain", "plain-asked"} {
		switch run {
		case "plain":
			submitRun(t, s, run, "")
		case "plain-asked": // its entry holds a cancel request and no agent
			submitRun(t, s, run, "")
			if _, err := s.RequestCancel(ctx, run, "ops"); err != nil {
				t.Fatal(err)
			}
		}
		before := s.Transactions()
		if err := s.ReleaseRun(ctx, run, "boom", 0); err != nil {
			t.Errorf("release of %s, which no queue holds: %v", run, err)
		}
		if n := s.Transactions() - before; n != 0 {
			t.Errorf("release of %s, which no queue holds, committed %d transactions", run, n)
		}
	}
}

// TestRequeueRunRefuses: RequeueRun's four refusals, each writing nothing.
func TestRequeueRunRefuses(t *testing.T) {
	s := openQueueStore(t, formatLog)
	ctx := context.Background()
	finishRun(t, s, "alpha-finished", submitRun(t, s, "alpha-finished", "alpha"))
	submitRun(t, s, "plain", "")
	submitRun(t, s, "alpha-held", "alpha")
	release, err := s.LockRun("alpha-held")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	before := s.Transactions()
	for _, c := range []struct {
		run  string
		want error
	}{
		{"never-written", seams.ErrNoRun},
		{"alpha-finished", seams.ErrRunFinished},
		{"plain", seams.ErrNotQueued},
		{"alpha-held", seams.ErrRunLocked},
	} {
		err := s.RequeueRun(ctx, c.run)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.run, err, c.want)
		}
		if errors.Is(c.want, seams.ErrRunLocked) && (err == nil || !strings.Contains(err.Error(), s.Owner())) {
			t.Errorf("%s: %v does not name the holder %s", c.run, err, s.Owner())
		}
	}
	if n := s.Transactions() - before; n != 0 {
		t.Errorf("refused requeues committed %d transactions", n)
	}
}

// TestRequeueRunHandsARunToTheWorkersNow: an operator's resume clears a
// run's retry time, failures and last error, and a claim nobody holds —
// an ended Open's, or this Store's whose driver let go — so a worker
// claims it at once.
func TestRequeueRunHandsARunToTheWorkersNow(t *testing.T) {
	s := openQueueStore(t, formatLog)
	ctx := context.Background()
	runs := []string{"alpha-failed", "alpha-mine", "alpha-zended"}
	for _, run := range runs {
		submitRun(t, s, run, "alpha")
	}
	claimIDs(t, s, 5, "alpha")
	s = reopen(t, s, Options{}) // alpha-zended keeps the claim of an ended Open
	if err := s.RequeueRun(ctx, "alpha-zended"); err != nil {
		t.Fatal(err)
	}
	if got := claimIDs(t, s, 2, "alpha"); !slices.Equal(got, runs[:2]) {
		t.Fatalf("claimed %q", got)
	}
	if err := s.ReleaseRun(ctx, "alpha-failed", "boom", time.Hour); err != nil {
		t.Fatal(err)
	}
	release, err := s.LockRun("alpha-mine")
	if err != nil {
		t.Fatal(err)
	}
	release() // its driver let go; the file still names this Store
	for _, run := range runs {
		if err := s.RequeueRun(ctx, run); err != nil {
			t.Fatalf("%s: %v", run, err)
		}
		if info := describeRun(t, s, run); info.Status != seams.StatusAwaiting || info.Owner != "" || info.Failures != 0 || info.LastError != "" || !info.RetryAt.IsZero() || info.Agent != "alpha" {
			t.Errorf("%s requeued: %+v, want awaiting for alpha, nothing held or failed", run, info)
		}
	}
	if got := claimIDs(t, s, 5, "alpha"); !slices.Equal(got, runs) {
		t.Errorf("after requeueing, claimed %q", got)
	}
}

// TestADamagedQueueEntryIsNotClaimedUntilRequeued: a damaged queue entry
// is never claimed, and giving it back says it is damaged; RequeueRun
// writes it anew from the run's RunStarted, and a worker claims it.
func TestADamagedQueueEntryIsNotClaimedUntilRequeued(t *testing.T) {
	for _, d := range queueDamages {
		t.Run(d.name, func(t *testing.T) {
			s := damagedQueue(t, d.damage)
			ctx := context.Background()
			if got := claimIDs(t, s, 5, "alpha", "beta"); !slices.Equal(got, []string{"o"}) {
				t.Errorf("claimed %q, want o alone", got)
			}
			if err := s.ReleaseRun(ctx, "r", "boom", 0); !errors.Is(err, events.ErrCorruption) {
				t.Errorf("release of a damaged entry: %v, want corruption", err)
			}
			if err := s.RequeueRun(ctx, "r"); err != nil {
				t.Fatal(err)
			}
			if info := describeRun(t, s, "r"); info.Status != seams.StatusAwaiting || info.Agent != "alpha" || info.LastError != "" {
				t.Errorf("requeued: %+v, want awaiting for alpha", info)
			}
			if r, err := s.CancelRequested(ctx, "r"); r != nil || err != nil {
				t.Errorf("CancelRequested of the entry written anew: %+v %v, want none", r, err)
			}
			if got := claimIDs(t, s, 5, "alpha"); !slices.Equal(got, []string{"r"}) {
				t.Errorf("claimed %q after the requeue, want r", got)
			}
		})
	}
}

// TestAnAgentsRunWithoutAQueueEntryIsRequeuedFromItsStart: a run started
// for an agent in a file whose queue was lost (or that an older version
// wrote) is claimed by nobody until an operator requeues it; its agent is
// read from its RunStarted, in both formats.
func TestAnAgentsRunWithoutAQueueEntryIsRequeuedFromItsStart(t *testing.T) {
	for _, format := range formats {
		t.Run("format="+format, func(t *testing.T) {
			s := openQueueStore(t, format)
			submitRun(t, s, "alpha-r", "alpha")
			s.Close()
			rawUpdate(t, s.Path(), func(tx *bolt.Tx) error { return tx.DeleteBucket(queueBucket) })
			s = reopen(t, s, Options{})
			if got := claimIDs(t, s, 5, "alpha"); len(got) != 0 {
				t.Errorf("claimed %q without a queue entry", got)
			}
			if err := s.RequeueRun(context.Background(), "alpha-r"); err != nil {
				t.Fatal(err)
			}
			claimExactly(t, s, "alpha-r")
		})
	}
}

// TestAClaimRemovesTheEntriesOfFinishedRuns: an entry a finished run kept
// (a version that kept no queue wrote its end) is removed by the next
// claim that meets it, and not claimed.
func TestAClaimRemovesTheEntriesOfFinishedRuns(t *testing.T) {
	s := openQueueStore(t, formatLog)
	submitRun(t, s, "alpha-stale", "alpha")
	s.Close()
	var entry []byte
	rawUpdate(t, s.Path(), func(tx *bolt.Tx) error {
		entry = bytes.Clone(tx.Bucket(queueBucket).Get([]byte("alpha-stale")))
		return nil
	})
	s = reopen(t, s, Options{})
	finishRun(t, s, "alpha-stale", describeRun(t, s, "alpha-stale").LastID)
	s.Close()
	rawUpdate(t, s.Path(), func(tx *bolt.Tx) error { return tx.Bucket(queueBucket).Put([]byte("alpha-stale"), entry) })
	s = reopen(t, s, Options{})
	submitRun(t, s, "alpha-live", "alpha")
	if got := claimIDs(t, s, 5, "alpha"); !slices.Equal(got, []string{"alpha-live"}) {
		t.Errorf("claimed %q, want alpha-live alone", got)
	}
	if got := queueKeys(t, s); !slices.Equal(got, []string{"alpha-live"}) {
		t.Errorf("the queue holds %q, want alpha-live alone", got)
	}
}
