package proptest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/oklog/ulid/v2"
	"pgregory.net/rapid"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/projections"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// storeFactory opens new, empty stores of one kind for rapid checks (rapid.T
// has no TempDir, so kv files go to the test's directory under fresh names;
// PostgreSQL has one store, emptied for each open).
type storeFactory struct {
	dir    string
	n      atomic.Int64
	pg     *pgstore.Store
	pgConn *pgx.Conn
}

// newStoreFactory prepares stores for t: PostgreSQL too when a server is
// at hand (pgtest), or fails t when one is required and missing.
func newStoreFactory(t *testing.T) *storeFactory {
	f := &storeFactory{dir: t.TempDir()}
	dsn, err := pgtest.Lookup()
	if err != nil {
		if v := os.Getenv(pgtest.RequiredEnv); v != "" && v != "0" {
			t.Fatalf("%s is set: %v", pgtest.RequiredEnv, err)
		}
		t.Logf("PostgreSQL left out: %s", pgtest.SkipHint)
		return f
	}
	ctx := context.Background()
	schema := pgtest.Schema(t)
	if f.pg, err = pgstore.Open(ctx, dsn, pgstore.Options{Schema: schema, MaxConns: 8}); err != nil {
		t.Fatal(err)
	}
	if f.pgConn, err = pgx.Connect(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.pg.Close(); f.pgConn.Close(ctx) })
	return f
}

// kinds is the store kinds drawn from: base, and PostgreSQL when there is
// a server (weighted like kv).
func (f *storeFactory) kinds(base ...string) []string {
	if f.pg == nil {
		return base
	}
	for _, k := range base {
		if k == "kv" {
			base = append(base, "postgres")
		}
	}
	return base
}

// open returns a new store of the named kind and a function closing it. kv
// runs without fsync: these properties test the append rules and recovery,
// not the disk (the test server runs without fsync too).
func (f *storeFactory) open(t *rapid.T, kind string) (seams.RunStore, func()) {
	switch kind {
	case "memory":
		return &seamstest.MemStore{}, func() {}
	case "postgres":
		q := "TRUNCATE " + pgx.Identifier{f.pg.Schema(), "events"}.Sanitize() + ", " + pgx.Identifier{f.pg.Schema(), "runs"}.Sanitize()
		if _, err := f.pgConn.Exec(context.Background(), q); err != nil {
			t.Fatalf("empty the postgres store: %v", err)
		}
		return f.pg, func() {}
	}
	path := filepath.Join(f.dir, fmt.Sprintf("s%d.db", f.n.Add(1)))
	s, err := kv.Open(path, kv.Options{NoSync: true})
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	return s, func() { s.Close() }
}

// view is another process's handle on a shared store: it has the store's
// append rules but not its in-process run locks, so only the tail rule
// stands between two drivers.
type view struct{ inner seams.RunStore }

func (v view) Append(ctx context.Context, runID string, after ulid.ULID, evs ...events.Event) ([]events.Envelope, error) {
	return v.inner.Append(ctx, runID, after, evs...)
}
func (v view) Load(ctx context.Context, runID string) ([]events.Envelope, error) {
	return v.inner.Load(ctx, runID)
}
func (v view) Parameters() map[string]string { return v.inner.Parameters() }

var driverStats struct {
	sync.Mutex
	checks, busy, lockedOut, continued int
}

// TestPropertyOneDriverPerRun: after a crash at a random write, 2–4 drivers
// (Run and Resume, in goroutines) race on the run, on kv and on MemStore,
// either sharing the store (its run lock applies) or each through its own
// view of it (another process: only the tail rule applies). Afterwards the
// log is sound and holds one continuation; no never side effect ran twice
// and none ran without a durable intent; every driver returned a result
// equal to the stored one, or ErrRunBusy (or ErrRunExists / ErrRunNotFound
// where the log said so before the race); a driver refused by the run lock
// called and executed nothing.
func TestPropertyOneDriverPerRun(t *testing.T) {
	ctx := context.Background()
	stores := newStoreFactory(t)
	rapid.Check(t, func(t *rapid.T) {
		s := drawScenario(t)
		kind := rapid.SampledFrom(stores.kinds("memory", "kv")).Draw(t, "store")
		shared := rapid.Bool().Draw(t, "shared_store")
		inner, closeStore := stores.open(t, kind)
		defer closeStore()

		first := s.agent(&proptest.CrashingStore{Inner: inner, After: rapid.IntRange(0, 14).Draw(t, "crash_after")}, nil, nil)
		if _, err := engine.Run(ctx, first.def, first.req); err != nil && !errors.Is(err, proptest.ErrCrashed) {
			t.Fatalf("first run: %v", err)
		}
		before, err := inner.Load(ctx, "p")
		if err != nil {
			t.Fatal(err)
		}

		n := rapid.IntRange(2, 4).Draw(t, "drivers")
		resumes := make([]bool, n)
		agents := make([]agent, n)
		for i := range n {
			resumes[i] = rapid.Bool().Draw(t, fmt.Sprint("resume_", i))
			var store seams.RunStore = inner
			if !shared {
				store = view{inner}
			}
			agents[i] = s.agent(store, nil, nil)
		}
		results := make([]events.RunResult, n)
		errs := make([]error, n)
		gate := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				drive := engine.Run
				if resumes[i] {
					drive = engine.Resume
				}
				results[i], errs[i] = drive(ctx, agents[i].def, agents[i].req)
			}()
		}
		close(gate)
		wg.Wait()

		final, err := inner.Load(ctx, "p")
		if err != nil {
			t.Fatal(err)
		}
		if len(final) > 0 {
			if err := recovery.Check("p", final); err != nil {
				t.Fatalf("the race left a corrupt log: %v", err)
			}
		}
		log := projections.Fold(final)
		policy := map[string]events.ReplayPolicy{}
		for _, in := range log.Intents {
			policy[in.ResultID] = in.ReplayPolicy
		}
		calls, execs := map[string]int{}, map[string]int{}
		for _, a := range append([]agent{first}, agents...) {
			for _, c := range a.model.Calls() {
				calls[c.ResultID]++
			}
			for _, c := range a.exec.Calls() {
				execs[c.ResultID]++
			}
		}
		for what, counts := range map[string]map[string]int{"model call": calls, "action": execs} {
			for id, k := range counts {
				p, announced := policy[id]
				switch {
				case !announced:
					t.Fatalf("%s %s was made without a durable intent", what, id)
				case k > 1 && p != events.ReplaySafe:
					t.Fatalf("%s %s (policy %s) was made %d times", what, id, p, k)
				}
			}
		}

		driverStats.Lock()
		defer driverStats.Unlock()
		driverStats.checks++
		for i, err := range errs {
			switch {
			case err == nil:
				stored, finished := log.Result()
				if !finished {
					t.Fatalf("driver %d returned a result but the run is not finished", i)
				}
				if results[i].StopReason != stored.StopReason || !proptest.SameSteps(results[i].Steps, stored.Steps) {
					t.Fatalf("driver %d returned %s after %d steps; the log holds %s after %d",
						i, results[i].StopReason, len(results[i].Steps), stored.StopReason, len(stored.Steps))
				}
				driverStats.continued++
			case errors.Is(err, engine.ErrRunBusy):
				driverStats.busy++
				if errors.Is(err, seams.ErrRunLocked) {
					if !shared {
						t.Fatalf("driver %d on its own view was refused by a run lock", i)
					}
					driverStats.lockedOut++
					if len(agents[i].model.Calls())+len(agents[i].exec.Calls()) > 0 {
						t.Fatalf("driver %d was refused by the run lock yet called the model or executed", i)
					}
				}
			case !resumes[i] && errors.Is(err, engine.ErrRunExists):
			case resumes[i] && len(before) == 0 && errors.Is(err, engine.ErrRunNotFound):
			default:
				t.Fatalf("driver %d (resume=%t) failed: %v", i, resumes[i], err)
			}
		}
	})
	driverStats.Lock()
	t.Logf("%d races: %d drivers refused with ErrRunBusy (%d by the run lock, the rest by the tail rule), %d returned the run's result",
		driverStats.checks, driverStats.busy, driverStats.lockedOut, driverStats.continued)
	driverStats.Unlock()
}
