package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/polyloop/polyloop/seams"
)

// DefaultLeaseDuration is a lease's term unless Options.LeaseDuration
// says otherwise: how long a dead or cut-off worker keeps its runs from
// the others.
const DefaultLeaseDuration = 30 * time.Second

// lease is a run this process holds (LockRun). mu guards every field.
type lease struct {
	mu sync.Mutex
	// onServer: the run's index row carries this lease. False while the
	// run has no row yet (a run being started): its first append writes
	// the row with the lease on it.
	onServer bool
	// valid is when the lease surely still holds by this process's clock:
	// the time the statement that last took or renewed it was sent, plus
	// the term (the server set its expiry later than that, by its own
	// clock).
	valid time.Time
	// lost, once set, says why this process no longer holds the run; every
	// later append and HoldsRun fails with it.
	lost error
	// row is the run's index row as this process's last append wrote it
	// (nil: unknown), so the driver's next append need not read it back.
	row *indexRow
	// cancel is the run's cancel request as the last statement that
	// touched its row for this lease read it back (taking it, appending,
	// renewing), or as RequestCancel through this store recorded it: what
	// CancelRequested answers without a round trip. A request, once
	// recorded, stays while the run is unfinished, so a statement's
	// answer only ever fills it.
	cancel *seams.CancelRequest
}

// noteCancel records a cancel request a statement read back for l's run;
// l.mu must be held. A nil answer (none yet, as of an older snapshot)
// never clears one already known.
func (l *lease) noteCancel(c *seams.CancelRequest) {
	if l.cancel == nil {
		l.cancel = c
	}
}

// cancelColumns are the columns a statement touching runs rows returns for
// a run's cancel request, named cancel_by and cancel_at, each prefixed with
// p (a table alias and a dot, or nothing): null for a finished run, whose
// request was carried out or is moot.
func cancelColumns(p string) string {
	return "CASE WHEN " + p + "status = 'running' THEN " + p + "cancel_by END AS cancel_by, " +
		"CASE WHEN " + p + "status = 'running' THEN " + p + "cancel_at END AS cancel_at"
}

// cancelRequest is the request the columns cancelColumns names hold, nil
// for none.
func cancelRequest(by *string, at *time.Time) *seams.CancelRequest {
	if by == nil || at == nil {
		return nil
	}
	return &seams.CancelRequest{By: *by, At: *at}
}

var _ seams.RunLeaser = (*Store)(nil)

// Owner is the id this store's leases carry: Options.Owner (or host and
// process id) and a random suffix.
func (s *Store) Owner() string { return s.owner }

// LockRun implements seams.RunLocker with a lease on the run's index row:
// a conditional UPDATE sets this store's owner id and an expiry (now plus
// Options.LeaseDuration, the server's clock) when nobody holds the run,
// its holder's lease expired, or the lease is this store's already (a run
// it claimed, ClaimRuns). No connection is held afterwards. A run
// held by a live lease of another worker, or by another driver of this
// process, fails at once with seams.ErrRunLocked naming the holder and
// its expiry. A run without an index row yet (one being started) is
// reserved in this process; its first append writes the row with the
// lease on it, and of two workers starting it the second's append is
// refused (seams.ErrRunExists). release gives the lease back (the run is
// free at once); if that fails, the lease expires.
func (s *Store) LockRun(runID string) (func(), error) {
	if s.readOnly {
		return nil, ErrReadOnly
	}
	if err := seams.ValidRunID(runID); err != nil {
		return nil, fmt.Errorf("pgstore: lock: %w", err)
	}
	s.leaseMu.Lock()
	if s.closed {
		s.leaseMu.Unlock()
		return nil, fmt.Errorf("pgstore: lock run %q: %w", runID, errClosed)
	}
	if _, held := s.leases[runID]; held {
		s.leaseMu.Unlock()
		return nil, fmt.Errorf("run %q: %w in this process", runID, seams.ErrRunLocked)
	}
	l := &lease{}
	s.leases[runID] = l
	s.leaseMu.Unlock()
	forget := func() {
		s.leaseMu.Lock()
		if s.leases[runID] == l {
			delete(s.leases, runID)
		}
		s.leaseMu.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.connectTimeout)
	defer cancel()
	if err := s.take(ctx, runID, l); err != nil {
		forget()
		return nil, err
	}
	return sync.OnceFunc(func() {
		// The run stays reserved in this process until its lease is given
		// back on the server: a driver of this process reserving it
		// meanwhile would take the lease under the same owner, and this
		// release would then clear that driver's lease.
		defer forget()
		l.mu.Lock()
		// A run whose lease this store may have written — its start
		// append's answer lost — is released too: the statement touches
		// only a lease that is this store's.
		held := l.lost == nil
		l.lost = fmt.Errorf("run %q: %w: this driver released it", runID, seams.ErrRunLocked)
		l.mu.Unlock()
		if held {
			ctx, cancel := context.WithTimeout(context.Background(), s.connectTimeout)
			defer cancel()
			s.pool.Exec(ctx, s.q.release, runID, s.owner) // on failure, the lease expires
		}
	}), nil
}

// take takes runID's lease for l: on the run's row when it has one and
// nobody live holds it; in this process only when it has none.
func (s *Store) take(ctx context.Context, runID string, l *lease) error {
	for attempt := 1; ; attempt++ {
		sent := time.Now()
		var (
			by *string
			at *time.Time
		)
		taken, err := retry(ctx, func() (bool, error) {
			err := s.pool.QueryRow(ctx, s.q.take, runID, s.owner, s.leaseTerm.Microseconds()).Scan(&by, &at)
			if errors.Is(err, pgx.ErrNoRows) {
				return false, nil
			}
			return err == nil, err
		})
		if err != nil {
			return fmt.Errorf("pgstore: lock run %q: %w", runID, err)
		}
		if taken {
			l.mu.Lock()
			l.onServer, l.valid = true, sent.Add(s.leaseTerm)
			l.noteCancel(cancelRequest(by, at))
			l.mu.Unlock()
			return nil
		}
		h, err := s.holder(ctx, runID)
		switch {
		case err != nil:
			return fmt.Errorf("pgstore: lock run %q: %w", runID, err)
		case !h.exists:
			return nil // a run not started yet: its first append writes the lease
		case h.live:
			return fmt.Errorf("run %q: %w (%s, lease until %s)", runID, seams.ErrRunLocked, h.owner, h.expires.UTC().Format(time.RFC3339Nano))
		case attempt == 3:
			return fmt.Errorf("pgstore: lock run %q: its lease changed hands three times while being taken: %w", runID, seams.ErrRunLocked)
		}
		// It was released or expired between the two statements: again.
	}
}

// leaseHolder is who holds a run's lease, as the server sees it now.
type leaseHolder struct {
	exists  bool // the run has an index row
	owner   string
	expires time.Time
	live    bool // a lease is held and has not expired
}

func (s *Store) holder(ctx context.Context, runID string) (leaseHolder, error) {
	var (
		h       leaseHolder
		owner   *string
		expires *time.Time
	)
	_, err := retry(ctx, func() (struct{}, error) {
		return struct{}{}, s.pool.QueryRow(ctx, s.q.holder, runID).Scan(&owner, &expires, &h.live)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return h, nil
	case err != nil:
		return h, fmt.Errorf("read the lease of run %q: %w", runID, err)
	}
	h.exists = true
	if owner != nil && expires != nil {
		h.owner, h.expires = *owner, *expires
	}
	return h, nil
}

// leaseOf is runID's lease when this process holds it, else nil.
func (s *Store) leaseOf(runID string) *lease {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	return s.leases[runID]
}

// HoldsRun implements seams.RunLeaser: nil while this process holds
// runID and at least a quarter of the lease's term is surely left by its
// own clock; with less left, it renews the lease first (one statement).
// A lease another worker took, or that was released, fails with an error
// wrapping seams.ErrRunLocked; a renewal that fails (the server cannot be
// reached) fails with its error, and the caller must stop as if the run
// were lost.
func (s *Store) HoldsRun(ctx context.Context, runID string) error {
	l := s.leaseOf(runID)
	if l == nil {
		return fmt.Errorf("run %q: %w: this process does not hold it", runID, seams.ErrRunLocked)
	}
	l.mu.Lock()
	// Left by both clocks: the monotonic one does not advance while the
	// machine is suspended (a paused VM, a live migration), the wall one
	// does.
	lost, onServer := l.lost, l.onServer
	left := min(time.Until(l.valid), l.valid.Round(0).Sub(time.Now().Round(0)))
	l.mu.Unlock()
	switch {
	case lost != nil:
		return lost
	case !onServer:
		return fmt.Errorf("run %q: %w: it has no index row, so no lease, yet", runID, seams.ErrRunLocked)
	case left > s.leaseTerm/4:
		return nil
	}
	if err := s.renew(ctx, map[string]*lease{runID: l}, false); err != nil {
		return fmt.Errorf("pgstore: run %q: the lease could not be renewed: %w", runID, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

// renew renews the given leases in one statement. A lease the statement
// finds held by another owner, or gone, is lost. The background renewal
// (skipLocked) skips a row another transaction has locked — an append of
// this process in flight, which renews the lease itself if it commits —
// instead of waiting for it: waiting there, while that append's group
// waits for a row the renewal locked, would deadlock. HoldsRun's renewal of
// one run waits, and so always renews or finds the lease lost.
func (s *Store) renew(ctx context.Context, held map[string]*lease, skipLocked bool) error {
	ids := make([]string, 0, len(held))
	for id := range held {
		ids = append(ids, id)
	}
	q := s.q.renew
	if skipLocked {
		q = s.q.renewUnlocked
	}
	type state struct {
		RunID    string
		Renewed  bool
		CancelBy *string
		CancelAt *time.Time
	}
	sent := time.Now()
	found, err := retry(ctx, func() ([]state, error) {
		rows, err := s.pool.Query(ctx, q, ids, s.owner, s.leaseTerm.Microseconds())
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, pgx.RowToStructByPos[state])
	})
	if err != nil {
		return err
	}
	for _, f := range found {
		l := held[f.RunID]
		if l == nil {
			continue
		}
		l.mu.Lock()
		if l.lost == nil {
			if f.Renewed {
				l.valid = sent.Add(s.leaseTerm)
			}
			l.noteCancel(cancelRequest(f.CancelBy, f.CancelAt))
		}
		l.mu.Unlock()
		delete(held, f.RunID) // still this process's
	}
	for id, l := range held {
		l.mu.Lock()
		if l.lost == nil {
			l.lost = fmt.Errorf("run %q: %w: this process's lease on it was taken over or released (it held it past its term)", id, seams.ErrRunLocked)
		}
		l.mu.Unlock()
	}
	return nil
}

// renewLeases renews, every third of the term, the leases whose validity
// has less than two thirds of the term left (a run's appends renew its
// lease too, so a run that appends often is seldom among them), until
// ctx ends.
func (s *Store) renewLeases(ctx context.Context) {
	t := time.NewTicker(s.leaseTerm / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		due := map[string]*lease{}
		s.leaseMu.Lock()
		if s.noRenew {
			s.leaseMu.Unlock()
			continue
		}
		for id, l := range s.leases {
			l.mu.Lock()
			if l.onServer && l.lost == nil && time.Until(l.valid) < 2*s.leaseTerm/3 {
				due[id] = l
			}
			l.mu.Unlock()
		}
		s.leaseMu.Unlock()
		if len(due) > 0 {
			rctx, cancel := context.WithTimeout(ctx, s.leaseTerm/3)
			s.renew(rctx, due, true) // on failure, HoldsRun tries again, and the validity lapses
			cancel()
		}
	}
}

// releaseAll gives back every lease this process holds (Close, once the
// appends queued were sent): their runs are free for other workers at
// once, and this process's drivers of them append nothing more.
func (s *Store) releaseAll() {
	s.leaseMu.Lock()
	var ids []string
	for id, l := range s.leases {
		l.mu.Lock()
		if l.lost == nil {
			l.lost = fmt.Errorf("run %q: %w: the store was closed", id, seams.ErrRunLocked)
			ids = append(ids, id)
		}
		l.mu.Unlock()
	}
	s.leaseMu.Unlock()
	if len(ids) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), s.connectTimeout)
		defer cancel()
		s.pool.Exec(ctx, s.q.releaseAll, ids, s.owner)
	}
}

// errClosed: the store was closed.
var errClosed = errors.New("pgstore: store is closed")
