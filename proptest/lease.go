package proptest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/polyloop/polyloop/seams"
)

// LeaseFleet opens n stores on one backing store for a test — n
// processes' views of a shared store, or an embedded store's one Store n
// times — whose leases, if any, last term. hang(i) makes the i-th stop
// renewing its leases, as a worker that is paused or cut off does; it is
// nil for stores whose reservations cannot expire (kv, MemStore: one
// process holds the store).
type LeaseFleet func(t *testing.T, n int, term time.Duration) (stores []seams.RunStore, hang func(i int))

// RunLeaseContract checks how a store's run reservations (seams.RunLocker,
// seams.RunLeaser) behave among several drivers: two never both hold a
// run; where leases expire, an expired lease is taken over, and the
// driver that lost it is told so by HoldsRun and has its appends refused
// with seams.ErrRunLocked, writing nothing, while the new holder's go on.
func RunLeaseContract(t *testing.T, fleet LeaseFleet) {
	ctx := context.Background()

	t.Run("TwoDriversNeverBothHoldARun", func(t *testing.T) {
		stores, _ := fleet(t, 3, time.Minute)
		if _, ok := stores[0].(seams.RunLocker); !ok {
			t.Skip("the store does not implement seams.RunLocker")
		}
		mustAppend(t, stores[0], "r", SoundStream("r")[:2]...)
		var (
			holders, most, held atomic.Int32
			wg                  sync.WaitGroup
		)
		for w := range 6 {
			s := stores[w%len(stores)]
			wg.Go(func() {
				for range 40 {
					release, err := s.(seams.RunLocker).LockRun("r")
					if errors.Is(err, seams.ErrRunLocked) {
						continue
					}
					if err != nil {
						t.Error(err)
						return
					}
					n := holders.Add(1)
					held.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					if l, ok := s.(seams.RunLeaser); ok {
						if err := l.HoldsRun(ctx, "r"); err != nil {
							t.Errorf("HoldsRun of a run just reserved: %v", err)
						}
					}
					time.Sleep(time.Millisecond)
					holders.Add(-1)
					release()
				}
			})
		}
		wg.Wait()
		if most.Load() != 1 || held.Load() == 0 {
			t.Fatalf("at most %d drivers held the run at once (%d reservations in all), want 1", most.Load(), held.Load())
		}
	})

	t.Run("AnExpiredLeaseIsTakenOverAndItsOldHolderWritesNothing", func(t *testing.T) {
		const term = time.Second
		stores, hang := fleet(t, 2, term)
		if hang == nil {
			t.Skip("the store's reservations do not expire")
		}
		a, b := stores[0], stores[1]
		tail := mustAppend(t, a, "r", SoundStream("r")[:2]...)[1].ID
		release, err := a.(seams.RunLocker).LockRun("r")
		if err != nil {
			t.Fatal(err)
		}
		defer release()
		if _, err := b.(seams.RunLocker).LockRun("r"); !errors.Is(err, seams.ErrRunLocked) {
			t.Fatalf("a live lease was taken: %v", err)
		}
		tail = mustAppend(t, a, "r", SoundStream("r")[2])[0].ID
		hang(0)
		start := time.Now()
		var releaseB func()
		for {
			if releaseB, err = b.(seams.RunLocker).LockRun("r"); err == nil {
				break
			}
			if !errors.Is(err, seams.ErrRunLocked) || time.Since(start) > 10*term {
				t.Fatalf("the lease of a worker that stopped renewing was not taken over: %v", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		defer releaseB()
		if waited := time.Since(start); waited < term/2 {
			t.Fatalf("taken over after %v, before the lease of %v could expire", waited, term)
		}
		// The old holder appends before it learns anything: the store
		// itself refuses it.
		if _, err := a.Append(ctx, "r", tail, SoundStream("r")[3]); !errors.Is(err, seams.ErrRunLocked) {
			t.Fatalf("the old holder's append: %v, want ErrRunLocked", err)
		}
		if err := a.(seams.RunLeaser).HoldsRun(ctx, "r"); !errors.Is(err, seams.ErrRunLocked) {
			t.Fatalf("the old holder's HoldsRun: %v, want ErrRunLocked", err)
		}
		if got := mustLoad(t, b, "r"); len(got) != 3 {
			t.Fatalf("the old holder's refused append left %d events, want 3", len(got))
		}
		if _, err := b.Append(ctx, "r", tail, SoundStream("r")[3]); err != nil {
			t.Fatalf("the new holder's append: %v", err)
		}
	})
}
