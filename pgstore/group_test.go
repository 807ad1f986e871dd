package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
)

// TestAppendsQueuedMeanwhileCommitTogether: appends of many runs queued
// while a statement is in flight go to the server together, in one
// transaction (their rows share one transaction id), and each run's
// conditions decide it alone: an append to a run another worker leases is
// refused in the group, and every other append of it commits. An append
// the server refuses with an error (its events' numbers taken behind the
// store's back) aborts its group's transaction; the group is then sent
// again one append at a time, so that error is its own alone.
func TestAppendsQueuedMeanwhileCommitTogether(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgstore.Options{MaxConns: 4}) // one sender
	other := open(t, pgstore.Options{Schema: s.Schema()})
	const n = 8
	tails := map[string]ulid.ULID{}
	for _, id := range []string{"first", "first2", "leased", "clash"} {
		tails[id] = appendTwo(t, s, id)
	}
	for i := range n {
		for _, p := range []string{"r", "q"} {
			id := fmt.Sprintf("%s%d", p, i)
			tails[id] = appendTwo(t, s, id)
		}
	}
	release, err := other.LockRun("leased")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	// The clash: an event numbered where the run's next append goes.
	exec(t, s.Schema(), `INSERT INTO {{schema}}.events SELECT run_id, 3, id, kind, value, crc FROM {{schema}}.events WHERE run_id = 'clash' AND seq = 2`)

	errs := groupOf(t, s, "first", tails, "leased", "r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7")
	for id, err := range errs {
		if id == "leased" && !errors.Is(err, seams.ErrRunLocked) {
			t.Errorf("append to a run another worker leases: %v, want ErrRunLocked", err)
		}
		if id != "leased" && err != nil {
			t.Errorf("append to %s: %v", id, err)
		}
	}
	if txns := transactions(t, s, "r"); txns != 1 {
		t.Fatalf("the %d queued appends committed in %d transactions, want 1", n, txns)
	}

	errs = groupOf(t, s, "first2", tails, "clash", "q0", "q1", "q2", "q3", "q4", "q5", "q6", "q7")
	for id, err := range errs {
		if id == "clash" && err == nil {
			t.Errorf("append onto events numbered behind the store's back succeeded")
		}
		if id != "clash" && err != nil {
			t.Errorf("append to %s, grouped with one the server refused: %v", id, err)
		}
	}
	for i := range n {
		for _, p := range []string{"r", "q"} {
			if got, err := s.Load(ctx, fmt.Sprintf("%s%d", p, i)); err != nil || len(got) != 3 {
				t.Fatalf("%s%d: %d events, %v", p, i, len(got), err)
			}
		}
	}
	if got, err := s.Load(ctx, "leased"); err != nil || len(got) != 2 {
		t.Fatalf("leased: %d events, %v", len(got), err)
	}
}

// groupOf appends the next event of run first and holds it in flight (the
// runs table locked by another session), appends the next event of each
// of ids meanwhile, waits until they are queued, lets the first go, and
// returns each one's error. The next event of a run is the third of its
// proptest.SoundStream.
func groupOf(t *testing.T, s *pgstore.Store, first string, tails map[string]ulid.ULID, ids ...string) map[string]error {
	t.Helper()
	return groupWith(t, s, func(id string) events.Event { return proptest.SoundStream(id)[2] }, first, tails, ids...)
}

// groupWith is groupOf appending next(id) to each run.
func groupWith(t *testing.T, s *pgstore.Store, next func(id string) events.Event, first string, tails map[string]ulid.ULID, ids ...string) map[string]error {
	t.Helper()
	ctx := context.Background()
	blocker, tx := holding(t, `LOCK TABLE `+pgx.Identifier{s.Schema(), "runs"}.Sanitize()+` IN SHARE ROW EXCLUSIVE MODE`)
	results := map[string]chan error{}
	appendNext := func(id string) {
		ch := make(chan error, 1)
		results[id] = ch
		go func() {
			_, err := s.Append(ctx, id, tails[id], next(id))
			ch <- err
		}()
	}
	appendNext(first)
	waitFor(t, "the first append to be in flight", func() bool { return pgstore.Queued(s) == 0 && waiting(t, blocker) })
	for _, id := range ids {
		appendNext(id)
	}
	waitFor(t, "the appends to be queued", func() bool { return pgstore.Queued(s) == len(ids) })
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-results[first]; err != nil {
		t.Fatalf("the first append: %v", err)
	}
	out := map[string]error{}
	for _, id := range ids {
		out[id] = <-results[id]
	}
	return out
}

// transactions is how many transactions wrote the third events of the
// runs whose ids start with prefix.
func transactions(t *testing.T, s *pgstore.Store, prefix string) int {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	err = conn.QueryRow(context.Background(), `SELECT count(DISTINCT xmin::text) FROM `+pgx.Identifier{s.Schema(), "events"}.Sanitize()+
		` WHERE starts_with(run_id, $1) AND seq = 3`, prefix).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waiting reports whether some session waits for a lock.
func waiting(t *testing.T, conn *pgx.Conn) bool { return lockWaiters(t, conn) > 0 }

// lockWaiters is how many sessions wait for a lock.
func lockWaiters(t *testing.T, conn *pgx.Conn) int {
	var n int
	if err := conn.QueryRow(context.Background(), `SELECT count(DISTINCT pid) FROM pg_locks WHERE NOT granted`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// appendTwo starts run id with two events and returns its tail.
func appendTwo(t *testing.T, s *pgstore.Store, id string) ulid.ULID {
	t.Helper()
	proptest.AppendEach(t, s, id, proptest.SoundStream(id)[:2])
	got, err := s.Load(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return got[len(got)-1].ID
}

// TestGroupedAppendsUnderCancellation: many runs appending at once, some
// of their appends abandoned by their contexts at random moments (queued,
// in flight or done). Every append that returned success is in its
// stream; every stream is sound and continues by its tail; an abandoned
// append either wrote nothing or, when it was in flight, is found whole or
// not at all.
func TestGroupedAppendsUnderCancellation(t *testing.T) {
	s := open(t, pgstore.Options{MaxConns: 8})
	const runs, appends = 16, 8
	var (
		wg                sync.WaitGroup
		abandoned, landed atomic.Int32
	)
	for r := range runs {
		wg.Go(func() {
			id := fmt.Sprintf("c%02d", r)
			stream := proptest.SoundStream(id)
			rng := rand.New(rand.NewPCG(uint64(r), 1))
			var tail ulid.ULID
			written := 0
			// Each append is abandoned at a random moment within limit,
			// which doubles after each abandoned one: on a loaded
			// machine, where most appends take longer than 3 ms, each
			// run still makes progress.
			limit := 3000
			for written < appends && written < len(stream) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(limit))*time.Microsecond)
				envs, err := s.Append(ctx, id, tail, stream[written])
				cancel()
				if err == nil {
					tail = envs[0].ID
					written++
					limit = 3000
					continue
				}
				// Abandoned: what is stored decides where the run is.
				abandoned.Add(1)
				limit *= 2
				got, lerr := s.Load(context.Background(), id)
				if lerr != nil {
					t.Errorf("%s: load after an abandoned append: %v", id, lerr)
					return
				}
				if len(got) != written && len(got) != written+1 {
					t.Errorf("%s: %d events stored after %d written and one abandoned", id, len(got), written)
					return
				}
				if len(got) > written {
					landed.Add(1)
				}
				if len(got) > 0 {
					tail = got[len(got)-1].ID
				}
				written = len(got)
			}
			got, err := s.Load(context.Background(), id)
			if err != nil || len(got) != written {
				t.Errorf("%s: %d events stored, %d written: %v", id, len(got), written, err)
			}
		})
	}
	wg.Wait()
	t.Logf("%d appends abandoned by their contexts, %d of them committed all the same", abandoned.Load(), landed.Load())
	if abandoned.Load() == 0 {
		t.Fatal("no append was abandoned: the test tested nothing")
	}
}

// TestCloseSendsTheAppendsAlreadyQueued: Close sends what is queued before
// it gives the process's leases back: an append in flight when Close
// begins and one queued behind it both commit (the second is not refused
// as if another worker held the run).
func TestCloseSendsTheAppendsAlreadyQueued(t *testing.T) {
	ctx := context.Background()
	s, err := pgstore.Open(ctx, pgtest.DSN(t), pgstore.Options{Schema: pgtest.Schema(t), MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	tails := map[string]ulid.ULID{}
	for _, id := range []string{"a", "b"} {
		tails[id] = appendTwo(t, s, id)
		if _, err := s.LockRun(id); err != nil { // released by Close
			t.Fatal(err)
		}
	}
	blocker, tx := holding(t, `SELECT 1 FROM `+pgx.Identifier{s.Schema(), "runs"}.Sanitize()+` WHERE run_id = 'b' FOR UPDATE`)
	results := map[string]chan error{"a": make(chan error, 1), "b": make(chan error, 1)}
	appendNext := func(id string) {
		_, err := s.Append(ctx, id, tails[id], proptest.SoundStream(id)[2])
		results[id] <- err
	}
	go appendNext("b")
	waitFor(t, "b's append to be in flight", func() bool { return pgstore.Queued(s) == 0 && waiting(t, blocker) })
	go appendNext("a")
	waitFor(t, "a's append to be queued", func() bool { return pgstore.Queued(s) == 1 })
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	waitFor(t, "Close to begin", func() bool {
		release, err := s.LockRun("c")
		if err == nil {
			release()
		}
		return err != nil && strings.Contains(err.Error(), "closed")
	})
	// A Close that gave the leases back first would be waiting for b's row
	// now too, having cleared a's lease; give it the time to get there.
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline) && lockWaiters(t, blocker) < 2; {
		time.Sleep(5 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"b", "a"} {
		if err := <-results[id]; err != nil {
			t.Errorf("append to %s, %s when Close began: %v", id, map[string]string{"a": "queued", "b": "in flight"}[id], err)
		}
	}
	<-closed
}

// holding opens a session of the test's own and, in a transaction left
// open, runs lock (a statement taking locks the store's appends will wait
// for); commit the transaction to let them go. The session ends with t.
func holding(t *testing.T, lock string) (*pgx.Conn, pgx.Tx) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, lock); err != nil {
		t.Fatal(err)
	}
	return conn, tx
}
