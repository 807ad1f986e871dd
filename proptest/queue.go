package proptest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// QueueStore is a store that hands runs to workers, keeps operators'
// cancel requests and describes one run: what RunQueueContract checks.
type QueueStore interface {
	seams.RunStore
	seams.RunReader
	seams.RunQueue
	seams.RunCanceller
	seams.RunDescriber
}

// AnotherQueueStore opens, on the backing store of s, a second store with
// an owner of its own — another process's view of a shared store (two
// pgstore.Stores on one schema) — for the rest of the test.
type AnotherQueueStore func(t *testing.T, s QueueStore) QueueStore

// RunQueueContract checks that a store keeps the rules of seams.RunQueue,
// seams.RunCanceller and seams.RunDescriber (seams/queue.go) as the worker
// pool and engine.Cancel rely on them, so that every store answers alike.
// open must return a new, empty store. another, when not nil, opens a
// second store with its own owner on the same backing store; the rules
// that take two holders are checked with it, and skipped for stores one
// process holds alone (kv, MemStore), which pass nil. The order of a
// claim's runs is the store's choice: the suite never depends on it.
func RunQueueContract(t *testing.T, open func(t *testing.T) QueueStore, another AnotherQueueStore) {
	ctx := context.Background()
	second := func(t *testing.T, s QueueStore) QueueStore {
		t.Helper()
		if another == nil {
			return nil
		}
		return another(t, s)
	}

	t.Run("AClaimTakesOnlyClaimableRunsOfTheNamedAgents", func(t *testing.T) {
		s := open(t)
		startQueued(t, s, "alpha-waiting", "alpha") // given back after a failure, its retry an hour away
		wantClaimed(t, s, []string{"alpha"}, 5, "alpha-waiting")
		giveBack(t, s, "alpha-waiting", "model: 503", time.Hour)
		for _, run := range []string{"alpha-1", "alpha-2", "beta-1", "gamma-1", "alpha-driven"} {
			startQueued(t, s, run, strings.Split(run, "-")[0])
		}
		startQueued(t, s, "plain-1", "")
		startQueued(t, s, "alpha-finished", "alpha")
		endRun(t, s, "alpha-finished")
		lockedRun(t, s, "alpha-driven")

		wantClaimed(t, s, []string{"alpha", "beta"}, 10, "alpha-1", "alpha-2", "beta-1")
		wantClaimed(t, s, []string{"alpha", "beta"}, 10) // claimed runs are not claimed again
		if other := second(t, s); other != nil {
			wantClaimed(t, other, []string{"alpha", "beta"}, 10) // nor by another store
		}
		wantClaimed(t, s, []string{"gamma"}, 10, "gamma-1")
	})

	t.Run("AClaimTakesAtMostMax", func(t *testing.T) {
		s := open(t)
		var all []string
		for i := range 5 {
			run := fmt.Sprintf("alpha-%d", i)
			startQueued(t, s, run, "alpha")
			all = append(all, run)
		}
		var got []string
		for _, want := range []int{2, 2, 1, 0} {
			ids := claimedIDs(t, s, []string{"alpha"}, 2)
			if len(ids) != want {
				t.Fatalf("a claim of at most 2 with %d runs left took %q, want %d runs", len(all)-len(got), ids, want)
			}
			got = append(got, ids...)
		}
		if slices.Sort(got); !slices.Equal(got, all) {
			t.Fatalf("the claims took %q, want each of %q once", got, all)
		}
	})

	t.Run("NoAgentsOrAMaxUnderOneClaimsNothing", func(t *testing.T) {
		s := open(t)
		startQueued(t, s, "alpha-1", "alpha")
		for _, c := range []struct {
			name   string
			agents []string
			max    int
		}{
			{"nil agents", nil, 5},
			{"empty agents", []string{}, 5},
			{"max 0", []string{"alpha"}, 0},
			{"max -1", []string{"alpha"}, -1},
		} {
			if claims, err := s.ClaimRuns(ctx, c.agents, c.max); err != nil || len(claims) != 0 {
				t.Errorf("%s: claimed %v (%v), want nothing and no error", c.name, claims, err)
			}
		}
		wantClaimed(t, s, []string{"alpha"}, 5, "alpha-1")
	})

	t.Run("AnAgentNameValidAgentRefusesIsAnError", func(t *testing.T) {
		s := open(t)
		startQueued(t, s, "alpha-1", "alpha")
		for _, bad := range []string{"", "bad\x00agent", strings.Repeat("a", seams.MaxAgentBytes+1)} {
			claims, err := s.ClaimRuns(ctx, []string{"alpha", bad}, 5)
			if !errors.Is(err, seams.ErrInvalidAgent) || len(claims) != 0 {
				t.Errorf("a claim naming the agent %.20q: %v (%v), want ErrInvalidAgent and nothing claimed", bad, claims, err)
			}
		}
		wantClaimed(t, s, []string{"alpha"}, 5, "alpha-1")
	})

	t.Run("ARunWithoutAnAgentIsNeverClaimed", func(t *testing.T) {
		s := open(t)
		startQueued(t, s, "plain-1", "")
		startQueued(t, s, "plain-2", "")
		if _, err := s.RequestCancel(ctx, "plain-2", "ops"); err != nil { // a request gives it coordination of its own
			t.Fatal(err)
		}
		for _, run := range []string{"plain-1", "plain-2"} {
			if err := s.ReleaseRun(ctx, run, "boom", 0); err != nil {
				t.Fatalf("ReleaseRun of %s: %v", run, err)
			}
		}
		wantClaimed(t, s, []string{"alpha", "plain"}, 5)
		for _, run := range []string{"plain-1", "plain-2"} {
			if info := describedRun(t, s, run); info.Status != seams.StatusInterrupted || info.Agent != "" || info.Failures != 0 || info.LastError != "" {
				t.Errorf("%s: %+v, want interrupted, no agent, no failure recorded", run, info)
			}
		}
	})

	t.Run("AClaimedRunIsTheClaimersToLock", func(t *testing.T) {
		s := open(t)
		startQueued(t, s, "alpha-1", "alpha")
		wantClaimed(t, s, []string{"alpha"}, 1, "alpha-1")
		claimer := describedRun(t, s, "alpha-1").Owner
		if claimer == "" {
			t.Fatal("a claimed run is described with no holder")
		}
		if other := second(t, s); other != nil {
			if _, err := other.LockRun("alpha-1"); !errors.Is(err, seams.ErrRunLocked) || !strings.Contains(err.Error(), claimer) {
				t.Fatalf("another store's LockRun of a claimed run: %v, want ErrRunLocked naming %s", err, claimer)
			}
		}
		lockedRun(t, s, "alpha-1")
		if _, err := s.LockRun("alpha-1"); !errors.Is(err, seams.ErrRunLocked) {
			t.Fatalf("a second driver's LockRun while the claimer drives: %v, want ErrRunLocked", err)
		}
		if info := describedRun(t, s, "alpha-1"); info.Status != seams.StatusRunning || info.Owner != claimer {
			t.Fatalf("driven by its claimer: %+v, want running, held by %s", info, claimer)
		}
	})

	t.Run("ConcurrentClaimersNeverGetTheSameRun", func(t *testing.T) {
		s := open(t)
		stores := []QueueStore{s, s}
		if other := second(t, s); other != nil {
			stores = append(stores, other, other)
		} else {
			stores = append(stores, s, s)
		}
		const runs = 24
		for i := range runs {
			startQueued(t, s, fmt.Sprintf("alpha-%02d", i), "alpha")
		}
		var (
			by      sync.Map // run → claimer
			claimed atomic.Int32
			wg      sync.WaitGroup
		)
		// The claimers take nothing with LockRun while they race: a claim
		// alone must keep the run from the others.
		deadline := time.Now().Add(time.Minute)
		for w, q := range stores {
			wg.Go(func() {
				for claimed.Load() < runs && time.Now().Before(deadline) {
					claims, err := q.ClaimRuns(ctx, []string{"alpha"}, 2)
					if err != nil {
						t.Error(err)
						return
					}
					for _, c := range claims {
						if first, dup := by.LoadOrStore(c.RunID, w); dup {
							t.Errorf("run %s claimed by claimer %d and by claimer %d", c.RunID, first, w)
							continue
						}
						claimed.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if n := claimed.Load(); n != runs {
			t.Fatalf("%d of %d runs claimed", n, runs)
		}
		by.Range(func(run, w any) bool {
			if _, err := stores[w.(int)].LockRun(run.(string)); err != nil {
				t.Errorf("the claimer's LockRun of %s: %v", run, err)
			}
			return true
		})
	})

	t.Run("AFinishedRunLeavesTheQueue", func(t *testing.T) {
		s := open(t)
		startQueued(t, s, "alpha-1", "alpha")
		wantClaimed(t, s, []string{"alpha"}, 1, "alpha-1")
		giveBack(t, s, "alpha-1", "model: 503", 0)
		if _, err := s.RequestCancel(ctx, "alpha-1", "ops"); err != nil {
			t.Fatal(err)
		}
		wantClaimed(t, s, []string{"alpha"}, 1, "alpha-1")
		release := lockedRun(t, s, "alpha-1")
		endRun(t, s, "alpha-1")
		release()
		stores := []QueueStore{s}
		if other := second(t, s); other != nil {
			stores = append(stores, other)
		}
		for _, q := range stores {
			wantClaimed(t, q, []string{"alpha"}, 5)
			info := describedRun(t, q, "alpha-1")
			if want := (seams.RunInfo{RunID: info.RunID, Status: seams.StatusFinished, Steps: info.Steps, Events: info.Events,
				StopReason: info.StopReason, FirstEvent: info.FirstEvent, LastEvent: info.LastEvent, LastID: info.LastID}); !reflect.DeepEqual(info, want) {
				t.Errorf("a finished run is described with queue state: %+v, want none (no agent, holder, failures, retry or request)", info)
			}
			if r, err := q.CancelRequested(ctx, "alpha-1"); r != nil || err != nil {
				t.Errorf("CancelRequested of a finished run: %+v (%v), want none", r, err)
			}
			if err := q.ReleaseRun(ctx, "alpha-1", "late", 0); err != nil {
				t.Errorf("ReleaseRun of a finished run: %v, want nothing done", err)
			}
			if err := q.RequeueRun(ctx, "alpha-1"); !errors.Is(err, seams.ErrRunFinished) {
				t.Errorf("RequeueRun of a finished run: %v, want ErrRunFinished", err)
			}
			if _, err := q.RequestCancel(ctx, "alpha-1", "ops"); !errors.Is(err, seams.ErrRunFinished) {
				t.Errorf("RequestCancel of a finished run: %v, want ErrRunFinished", err)
			}
			sameDescription(t, q, "alpha-1")
		}
	})

	t.Run("ARunIsFreeOnceItsDriverLetsGo", func(t *testing.T) {
		s := open(t)
		other := second(t, s)
		for _, c := range []struct {
			name  string
			drive func(run string)
		}{
			{"its claimer drove it", func(run string) { lockedRun(t, s, run)() }},
			// The worker whose claim another driver took (engine.ErrRunBusy)
			// does nothing; that driver's release frees the run.
			{"another driver took it before its claimer", func(run string) {
				release := lockedRun(t, s, run)
				if _, err := s.LockRun(run); !errors.Is(err, seams.ErrRunLocked) {
					t.Fatalf("the claimer's LockRun of a run another driver holds: %v, want ErrRunLocked", err)
				}
				release()
			}},
		} {
			run := "alpha-" + strings.ReplaceAll(c.name, " ", "-")
			startQueued(t, s, run, "alpha")
			wantClaimed(t, s, []string{"alpha"}, 1, run)
			c.drive(run)
			if info := describedRun(t, s, run); info.Status != seams.StatusAwaiting || info.Owner != "" {
				t.Errorf("%s, then let go: %+v, want awaiting, held by nobody", c.name, info)
			}
			if other != nil {
				wantClaimed(t, other, []string{"alpha"}, 5, run)
				giveBack(t, other, run, "", 0)
			}
			wantClaimed(t, s, []string{"alpha"}, 5, run)
		}
	})

	t.Run("AReleaseWithoutAFailureMakesTheRunClaimableAtOnce", func(t *testing.T) {
		s := open(t)
		other := second(t, s)
		startQueued(t, s, "alpha-1", "alpha")
		for i, failures := range []struct {
			before    int
			lastError string
		}{{0, ""}, {1, "model: 503"}} {
			if failures.before > 0 {
				wantClaimed(t, s, []string{"alpha"}, 1, "alpha-1")
				giveBack(t, s, "alpha-1", failures.lastError, 0)
			}
			wantClaimed(t, s, []string{"alpha"}, 1, "alpha-1")
			lockedRun(t, s, "alpha-1")() // the engine lets go as the worker shuts down
			giveBack(t, s, "alpha-1", "", 0)
			info := describedRun(t, s, "alpha-1")
			if info.Status != seams.StatusAwaiting || info.Owner != "" || !info.RetryAt.IsZero() || info.Failures != failures.before || info.LastError != failures.lastError {
				t.Errorf("release %d: %+v, want awaiting, held by nobody, no retry time, %d failures, last error %q",
					i, info, failures.before, failures.lastError)
			}
			claimer := s
			if other != nil {
				claimer = other
			}
			wantClaimed(t, claimer, []string{"alpha"}, 1, "alpha-1")
			giveBack(t, claimer, "alpha-1", "", 0)
		}
	})

	t.Run("AReleaseWithoutAFailureButWithARetryHidesTheRunAndCountsNothing", func(t *testing.T) {
		// A worker parks a run that waits for a person's decision: not a
		// failure, but nothing to claim before its retry time.
		s := open(t)
		other := second(t, s)
		startQueued(t, s, "alpha-parked", "alpha")
		wantClaimed(t, s, []string{"alpha"}, 1, "alpha-parked")
		giveBack(t, s, "alpha-parked", "model: 503", 0)
		wantClaimed(t, s, []string{"alpha"}, 1, "alpha-parked")
		before := time.Now()
		giveBack(t, s, "alpha-parked", "", time.Hour)
		info := describedRun(t, s, "alpha-parked")
		if info.Status != seams.StatusAwaiting || info.Owner != "" || info.Failures != 1 || info.LastError != "model: 503" ||
			info.RetryAt.Before(before.Add(59*time.Minute)) {
			t.Errorf("parked: %+v, want awaiting, held by nobody, 1 failure kept, retry in an hour", info)
		}
		wantClaimed(t, s, []string{"alpha"}, 5)
		if other != nil {
			wantClaimed(t, other, []string{"alpha"}, 5)
		}
		if err := s.RequeueRun(ctx, "alpha-parked"); err != nil {
			t.Fatalf("RequeueRun of a parked run: %v", err)
		}
		wantClaimed(t, s, []string{"alpha"}, 5, "alpha-parked")
	})

	t.Run("AFailedReleaseRecordsTheFailureAndHidesTheRunUntilItsRetryTime", func(t *testing.T) {
		s := open(t)
		other := second(t, s)
		startQueued(t, s, "alpha-later", "alpha")
		wantClaimed(t, s, []string{"alpha"}, 1, "alpha-later")
		before := time.Now()
		giveBack(t, s, "alpha-later", "model: 503", time.Hour)
		after := time.Now()
		info := describedRun(t, s, "alpha-later")
		if info.Status != seams.StatusAwaiting || info.Owner != "" || info.Failures != 1 || info.LastError != "model: 503" ||
			!within(info.RetryAt, before.Add(time.Hour), after.Add(time.Hour)) {
			t.Errorf("given back failed: %+v, want awaiting, held by nobody, 1 failure, last error %q, retry in an hour", info, "model: 503")
		}
		wantClaimed(t, s, []string{"alpha"}, 5)
		if other != nil {
			wantClaimed(t, other, []string{"alpha"}, 5)
		}

		startQueued(t, s, "alpha-soon", "alpha")
		wantClaimed(t, s, []string{"alpha"}, 1, "alpha-soon")
		giveBack(t, s, "alpha-soon", "parameters changed", 1500*time.Millisecond)
		retryAt := describedRun(t, s, "alpha-soon").RetryAt
		for {
			ids := claimedIDs(t, s, []string{"alpha"}, 5)
			now := time.Now() // the claim was made before now
			if len(ids) > 0 {
				if !slices.Equal(ids, []string{"alpha-soon"}) || now.Before(retryAt) {
					t.Fatalf("claimed %q at %v, want alpha-soon once its retry time %v came", ids, now, retryAt)
				}
				break
			}
			if now.After(retryAt.Add(10 * time.Second)) {
				t.Fatalf("not claimed 10s after its retry time %v", retryAt)
			}
			time.Sleep(50 * time.Millisecond)
		}
		giveBack(t, s, "alpha-soon", "again", 0)
		if info := describedRun(t, s, "alpha-soon"); info.Failures != 2 || info.LastError != "again" {
			t.Errorf("after a second failure: %+v, want 2 failures, last error %q", info, "again")
		}
		wantClaimed(t, s, []string{"alpha"}, 5, "alpha-soon") // a retry of 0: at once
	})

	t.Run("AReleaseLeavesARunItDoesNotGiveBack", func(t *testing.T) {
		s := open(t)
		other := second(t, s)
		type release struct {
			run, failure string
			retry        time.Duration
		}
		for _, c := range []struct {
			name  string
			setup func() release
			fails bool // an error naming what is wrong, writing nothing
		}{
			{"a run a driver of this store holds", func() release {
				startQueued(t, s, "alpha-driven", "alpha")
				wantClaimed(t, s, []string{"alpha"}, 1, "alpha-driven")
				lockedRun(t, s, "alpha-driven")
				return release{"alpha-driven", "boom", 0}
			}, false},
			{"a run another store holds", func() release {
				if other == nil {
					return release{}
				}
				startQueued(t, s, "beta-theirs", "beta")
				wantClaimed(t, other, []string{"beta"}, 1, "beta-theirs")
				return release{"beta-theirs", "boom", 0}
			}, false},
			{"a run without an agent", func() release {
				startQueued(t, s, "plain-1", "")
				return release{"plain-1", "boom", 0}
			}, false},
			{"a run without an agent asked to cancel", func() release {
				startQueued(t, s, "plain-2", "")
				if _, err := s.RequestCancel(ctx, "plain-2", "ops"); err != nil {
					t.Fatal(err)
				}
				return release{"plain-2", "boom", 0}
			}, false},
			{"a finished run", func() release {
				startQueued(t, s, "gamma-done", "gamma")
				endRun(t, s, "gamma-done")
				return release{"gamma-done", "boom", 0}
			}, false},
			{"a negative retry", func() release {
				startQueued(t, s, "delta-claimed", "delta")
				wantClaimed(t, s, []string{"delta"}, 1, "delta-claimed")
				return release{"delta-claimed", "boom", -time.Second}
			}, true},
		} {
			r := c.setup()
			if r.run == "" {
				continue // a rule of two holders
			}
			before := describedRun(t, s, r.run)
			err := s.ReleaseRun(ctx, r.run, r.failure, r.retry)
			switch {
			case c.fails && (err == nil || !strings.Contains(err.Error(), "negative")):
				t.Errorf("%s: %v, want an error saying the retry is negative", c.name, err)
			case !c.fails && err != nil:
				t.Errorf("%s: %v, want nothing done", c.name, err)
			}
			if after := describedRun(t, s, r.run); !reflect.DeepEqual(after, before) {
				t.Errorf("%s: ReleaseRun changed it from %+v to %+v", c.name, before, after)
			}
		}
		if err := s.ReleaseRun(ctx, "never-written", "boom", 0); err != nil {
			t.Errorf("a run never written: %v, want nothing done", err)
		}
		if _, err := s.Describe(ctx, "never-written"); !errors.Is(err, seams.ErrNoRun) {
			t.Errorf("a run never written, after ReleaseRun: %v, want ErrNoRun", err)
		}
	})

	t.Run("RequeueRunClearsTheBackOffAndKeepsTheCancelRequest", func(t *testing.T) {
		s := open(t)
		startQueued(t, s, "alpha-1", "alpha")
		wantClaimed(t, s, []string{"alpha"}, 1, "alpha-1")
		giveBack(t, s, "alpha-1", "model: 503", 0)
		wantClaimed(t, s, []string{"alpha"}, 1, "alpha-1")
		giveBack(t, s, "alpha-1", "parameters changed", time.Hour)
		if _, err := s.RequestCancel(ctx, "alpha-1", "ops"); err != nil {
			t.Fatal(err)
		}
		if err := s.RequeueRun(ctx, "alpha-1"); err != nil {
			t.Fatalf("RequeueRun of a run in back-off: %v", err)
		}
		info := describedRun(t, s, "alpha-1")
		if info.Status != seams.StatusAwaiting || info.Owner != "" || info.Failures != 0 || info.LastError != "" || !info.RetryAt.IsZero() ||
			info.CancelRequested == nil || info.CancelRequested.By != "ops" {
			t.Errorf("requeued: %+v, want awaiting, no failures, last error or retry time, the request by ops kept", info)
		}
		claimer := s
		if other := second(t, s); other != nil {
			claimer = other
		}
		wantClaimed(t, claimer, []string{"alpha"}, 5, "alpha-1")
	})

	t.Run("RequeueRunRefusesWritingNothing", func(t *testing.T) {
		s := open(t)
		other := second(t, s)
		for _, c := range []struct {
			name, agent string
			setup       func(run string)
			want        error
			holder      bool // the error names the run's holder
		}{
			{"a run never written", "alpha", func(string) {}, seams.ErrNoRun, false},
			{"a finished run", "beta", func(run string) { startQueued(t, s, run, "beta"); endRun(t, s, run) }, seams.ErrRunFinished, false},
			{"a run without an agent", "", func(run string) { startQueued(t, s, run, "") }, seams.ErrNotQueued, false},
			{"a run a driver holds", "gamma", func(run string) { startQueued(t, s, run, "gamma"); lockedRun(t, s, run) }, seams.ErrRunLocked, true},
			{"a run claimed and not yet driven", "delta", func(run string) {
				startQueued(t, s, run, "delta")
				wantClaimed(t, s, []string{"delta"}, 1, run)
			}, seams.ErrRunLocked, true},
			{"a run another store claimed", "epsilon", func(run string) {
				startQueued(t, s, run, "epsilon")
				wantClaimed(t, other, []string{"epsilon"}, 1, run)
			}, seams.ErrRunLocked, true},
		} {
			if other == nil && strings.Contains(c.name, "another store") {
				continue
			}
			run := runName(c.agent, c.name)
			c.setup(run)
			before, _ := s.Describe(ctx, run)
			err := s.RequeueRun(ctx, run)
			if !errors.Is(err, c.want) || c.holder && !strings.Contains(err.Error(), before.Owner) {
				t.Errorf("%s: %v, want %v naming the holder %q", c.name, err, c.want, before.Owner)
			}
			if after, _ := s.Describe(ctx, run); !reflect.DeepEqual(after, before) {
				t.Errorf("%s: the refused RequeueRun changed it from %+v to %+v", c.name, before, after)
			}
		}
	})

	t.Run("ACancelRequestIsDurableAndTheFirstStays", func(t *testing.T) {
		s := open(t)
		startQueued(t, s, "alpha-1", "alpha")
		before := time.Now()
		if holder, err := s.RequestCancel(ctx, "alpha-1", "ops"); err != nil || holder != "" {
			t.Fatalf("RequestCancel of a run nobody holds: holder %q (%v), want nobody", holder, err)
		}
		after := time.Now()
		first := cancelOf(t, s, "alpha-1")
		if first == nil || first.By != "ops" || !within(first.At, before, after) {
			t.Fatalf("the request: %+v, want by ops, at the time it was made", first)
		}
		if holder, err := s.RequestCancel(ctx, "alpha-1", "admin"); err != nil || holder != "" {
			t.Fatalf("a second RequestCancel: holder %q (%v)", holder, err)
		}
		stores := []QueueStore{s}
		if other := second(t, s); other != nil {
			stores = append(stores, other)
		}
		for _, q := range stores {
			for how, r := range map[string]*seams.CancelRequest{
				"CancelRequested": cancelOf(t, q, "alpha-1"),
				"Describe":        describedRun(t, q, "alpha-1").CancelRequested,
				"Runs":            listedRun(t, q, "alpha-1").CancelRequested,
			} {
				if r == nil || r.By != first.By || !r.At.Equal(first.At) {
					t.Errorf("%s after a second request: %+v, want the first, %+v", how, r, first)
				}
			}
		}
	})

	t.Run("RequestCancelRefusesWritingNothing", func(t *testing.T) {
		s := open(t)
		startQueued(t, s, "alpha-done", "alpha")
		endRun(t, s, "alpha-done")
		if _, err := s.RequestCancel(ctx, "never-written", "ops"); !errors.Is(err, seams.ErrNoRun) {
			t.Errorf("a run never written: %v, want ErrNoRun", err)
		}
		if _, err := s.Describe(ctx, "never-written"); !errors.Is(err, seams.ErrNoRun) {
			t.Errorf("a run never written, after RequestCancel: %v, want ErrNoRun", err)
		}
		before := describedRun(t, s, "alpha-done")
		if _, err := s.RequestCancel(ctx, "alpha-done", "ops"); !errors.Is(err, seams.ErrRunFinished) {
			t.Errorf("a finished run: %v, want ErrRunFinished", err)
		}
		if after := describedRun(t, s, "alpha-done"); !reflect.DeepEqual(after, before) || cancelOf(t, s, "alpha-done") != nil {
			t.Errorf("a finished run, after a refused request: %+v, want it as it was, %+v, with no request", after, before)
		}
		if r := cancelOf(t, s, "never-written"); r != nil {
			t.Errorf("CancelRequested of a run never written: %+v, want none", r)
		}
	})

	t.Run("RequestCancelNamesTheHolder", func(t *testing.T) {
		s := open(t)
		other := second(t, s)
		for _, c := range []struct {
			name, agent string
			setup       func(run string)
			held        bool
		}{
			{"a queued run", "alpha", func(string) {}, false},
			{"a run without an agent", "", func(string) {}, false},
			// Its claimer takes it at once and sees the request.
			{"a run claimed and not yet driven", "beta", func(run string) { wantClaimed(t, s, []string{"beta"}, 1, run) }, true},
			{"a run its claimer drives", "gamma", func(run string) {
				wantClaimed(t, s, []string{"gamma"}, 1, run)
				lockedRun(t, s, run)
			}, true},
			{"a run without an agent a driver holds", "", func(run string) { lockedRun(t, s, run) }, true},
			{"a run its driver let go", "delta", func(run string) {
				wantClaimed(t, s, []string{"delta"}, 1, run)
				lockedRun(t, s, run)()
			}, false},
			{"a run another store claimed", "epsilon", func(run string) { wantClaimed(t, other, []string{"epsilon"}, 1, run) }, true},
		} {
			if other == nil && strings.Contains(c.name, "another store") {
				continue
			}
			run := runName(c.agent, c.name)
			startQueued(t, s, run, c.agent)
			c.setup(run)
			want := ""
			if c.held {
				if want = describedRun(t, s, run).Owner; want == "" {
					t.Fatalf("%s: described with no holder", c.name)
				}
			}
			if holder, err := s.RequestCancel(ctx, run, "ops"); err != nil || holder != want {
				t.Errorf("%s: holder %q (%v), want %q", c.name, holder, err, want)
			}
			// Through the store that made it, the request is seen at once.
			if r := cancelOf(t, s, run); r == nil || r.By != "ops" {
				t.Errorf("%s: CancelRequested right after the request: %+v, want the request by ops", c.name, r)
			}
		}
	})

	t.Run("TheStoreThatTakesARunSeesItsCancelRequest", func(t *testing.T) {
		s := open(t)
		other := second(t, s)
		asker := s
		if other != nil {
			asker = other
		}
		startQueued(t, s, "alpha-1", "alpha")
		wantClaimed(t, s, []string{"alpha"}, 1, "alpha-1")
		if _, err := asker.RequestCancel(ctx, "alpha-1", "ops"); err != nil {
			t.Fatal(err)
		}
		lockedRun(t, s, "alpha-1")
		if r := cancelOf(t, s, "alpha-1"); r == nil || r.By != "ops" {
			t.Errorf("CancelRequested by the store that took the run after the request: %+v, want the request", r)
		}
		if other == nil {
			return
		}
		// A request another store records while this one drives the run is
		// seen after the driver's next append.
		startQueued(t, s, "beta-1", "beta")
		wantClaimed(t, s, []string{"beta"}, 1, "beta-1")
		lockedRun(t, s, "beta-1")
		holder, err := other.RequestCancel(ctx, "beta-1", "ops")
		if err != nil || holder != describedRun(t, s, "beta-1").Owner {
			t.Fatalf("another store's RequestCancel of a run this one drives: holder %q (%v)", holder, err)
		}
		mustAppend(t, s, "beta-1", SoundStream("beta-1")[2])
		if r := cancelOf(t, s, "beta-1"); r == nil || r.By != "ops" {
			t.Errorf("CancelRequested by the driver after its next append: %+v, want the request", r)
		}
	})

	t.Run("DescribeAgreesWithRunsAndTellsWhoHoldsARun", func(t *testing.T) {
		s := open(t)
		other := second(t, s)
		for _, c := range []struct {
			name, agent string
			setup       func(run string)
			want        seams.RunStatus
		}{
			{"queued", "alpha", func(string) {}, seams.StatusAwaiting},
			{"claimed", "beta", func(run string) { wantClaimed(t, s, []string{"beta"}, 1, run) }, seams.StatusRunning},
			{"driven", "gamma", func(run string) { wantClaimed(t, s, []string{"gamma"}, 1, run); lockedRun(t, s, run) }, seams.StatusRunning},
			{"let go", "delta", func(run string) { wantClaimed(t, s, []string{"delta"}, 1, run); lockedRun(t, s, run)() }, seams.StatusAwaiting},
			{"given back", "epsilon", func(run string) {
				wantClaimed(t, s, []string{"epsilon"}, 1, run)
				lockedRun(t, s, run)()
				giveBack(t, s, run, "", 0)
			}, seams.StatusAwaiting},
			{"in back-off", "zeta", func(run string) {
				wantClaimed(t, s, []string{"zeta"}, 1, run)
				giveBack(t, s, run, "model: 503", time.Hour)
			}, seams.StatusAwaiting},
			{"asked to cancel", "eta", func(run string) {
				if _, err := s.RequestCancel(ctx, run, "ops"); err != nil {
					t.Fatal(err)
				}
			}, seams.StatusAwaiting},
			{"without an agent", "", func(string) {}, seams.StatusInterrupted},
			{"without an agent, driven", "", func(run string) { lockedRun(t, s, run) }, seams.StatusRunning},
			{"without an agent, its driver gone", "", func(run string) { lockedRun(t, s, run)() }, seams.StatusInterrupted},
			{"without an agent, asked to cancel", "", func(run string) {
				if _, err := s.RequestCancel(ctx, run, "ops"); err != nil {
					t.Fatal(err)
				}
			}, seams.StatusInterrupted},
			{"finished", "theta", func(run string) { endRun(t, s, run) }, seams.StatusFinished},
			{"claimed by another store", "iota", func(run string) { wantClaimed(t, other, []string{"iota"}, 1, run) }, seams.StatusRunning},
		} {
			if other == nil && strings.Contains(c.name, "another store") {
				continue
			}
			run := runName(c.agent, c.name)
			startQueued(t, s, run, c.agent)
			c.setup(run)
			info := sameDescription(t, s, run)
			agent := c.agent
			if c.want == seams.StatusFinished {
				agent = "" // no worker pool claims it
			}
			if info.Status != c.want || info.Agent != agent || (info.Owner != "") != (c.want == seams.StatusRunning) {
				t.Errorf("%s: %+v, want %s, agent %q, a holder named only when running", c.name, info, c.want, agent)
			}
			if other != nil {
				if got := sameDescription(t, other, run); !reflect.DeepEqual(got, info) {
					t.Errorf("%s: another store describes it as %+v, this one as %+v", c.name, got, info)
				}
			}
		}
		owners := map[string]bool{}
		for _, run := range []string{runName("beta", "claimed"), runName("gamma", "driven"), runName("", "without an agent, driven")} {
			owners[describedRun(t, s, run).Owner] = true
		}
		if len(owners) != 1 {
			t.Errorf("the runs this store holds name %d holders, want one: %v", len(owners), owners)
		}
		if _, err := s.Describe(ctx, "never-written"); !errors.Is(err, seams.ErrNoRun) {
			t.Errorf("Describe of a run never written: %v, want ErrNoRun", err)
		}
	})
}

// startQueued starts run for agent (a run no worker pool claims when agent
// is ""): its RunStarted and a first intent.
func startQueued(t *testing.T, s seams.RunStore, run, agent string) ulid.ULID {
	t.Helper()
	stream := SoundStream(run)
	started := stream[0].(events.RunStarted)
	started.Agent = agent
	return mustAppend(t, s, run, started, stream[1])[1].ID
}

// runName is a run id for a case named name of agent's runs: the agent
// ("plain" for none), "-" and the name with dashes for blanks.
func runName(agent, name string) string {
	if agent == "" {
		agent = "plain"
	}
	return agent + "-" + strings.NewReplacer(" ", "-", ",", "").Replace(name)
}

// endRun appends run's RunFinished; where the store leases runs, the
// caller holds run or nobody does.
func endRun(t *testing.T, s seams.RunStore, run string) {
	t.Helper()
	stream := SoundStream(run)
	mustAppend(t, s, run, stream[len(stream)-1])
}

// claimedIDs is what s claims of agents, at most max, by run id; a claim
// naming an agent other than its run's (a run id's prefix before "-") fails
// the test.
func claimedIDs(t *testing.T, s seams.RunQueue, agents []string, max int) []string {
	t.Helper()
	claims, err := s.ClaimRuns(context.Background(), agents, max)
	if err != nil {
		t.Fatalf("ClaimRuns(%q, %d): %v", agents, max, err)
	}
	var ids []string
	for _, c := range claims {
		if c.Agent == "" || !strings.HasPrefix(c.RunID, c.Agent+"-") {
			t.Fatalf("claim %+v names an agent the run was not started for", c)
		}
		ids = append(ids, c.RunID)
	}
	slices.Sort(ids)
	return ids
}

// wantClaimed claims for agents, at most max, and fails the test unless
// exactly want (any order) were claimed.
func wantClaimed(t *testing.T, s seams.RunQueue, agents []string, max int, want ...string) {
	t.Helper()
	slices.Sort(want)
	if got := claimedIDs(t, s, agents, max); !slices.Equal(got, want) {
		t.Fatalf("a claim of at most %d runs of %q took %q, want %q", max, agents, got, want)
	}
}

// giveBack releases run with ReleaseRun; an error fails the test.
func giveBack(t *testing.T, s seams.RunQueue, run, failure string, retry time.Duration) {
	t.Helper()
	if err := s.ReleaseRun(context.Background(), run, failure, retry); err != nil {
		t.Fatalf("ReleaseRun(%q, %q, %v): %v", run, failure, retry, err)
	}
}

// lockedRun takes run with LockRun, released when the test ends at the
// latest.
func lockedRun(t *testing.T, s seams.RunLocker, run string) (release func()) {
	t.Helper()
	release, err := s.LockRun(run)
	if err != nil {
		t.Fatalf("LockRun(%q): %v", run, err)
	}
	t.Cleanup(release)
	return release
}

// describedRun is run's entry by s's Describe.
func describedRun(t *testing.T, s seams.RunDescriber, run string) seams.RunInfo {
	t.Helper()
	info, err := s.Describe(context.Background(), run)
	if err != nil {
		t.Fatalf("Describe(%q): %v", run, err)
	}
	return info
}

// listedRun is run's entry in s's Runs.
func listedRun(t *testing.T, s seams.RunReader, run string) seams.RunInfo {
	t.Helper()
	runs, err := s.Runs(context.Background())
	if err != nil {
		t.Fatalf("Runs: %v", err)
	}
	for _, info := range runs {
		if info.RunID == run {
			return info
		}
	}
	t.Fatalf("Runs does not list %q", run)
	return seams.RunInfo{}
}

// sameDescription is run's entry, after checking that Describe and Runs
// give the same one.
func sameDescription(t *testing.T, s QueueStore, run string) seams.RunInfo {
	t.Helper()
	described, listed := describedRun(t, s, run), listedRun(t, s, run)
	if !reflect.DeepEqual(described, listed) {
		t.Errorf("run %s: Describe gives %+v, Runs lists %+v", run, described, listed)
	}
	return described
}

// cancelOf is run's cancel request by s's CancelRequested.
func cancelOf(t *testing.T, s seams.RunCanceller, run string) *seams.CancelRequest {
	t.Helper()
	r, err := s.CancelRequested(context.Background(), run)
	if err != nil {
		t.Fatalf("CancelRequested(%q): %v", run, err)
	}
	return r
}

// within reports whether at lies between from and to, give or take the
// second a server's clock and timestamps' rounding may differ by.
func within(at, from, to time.Time) bool {
	return !at.Before(from.Add(-time.Second)) && !at.After(to.Add(time.Second))
}
