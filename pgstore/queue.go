package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

var (
	_ seams.RunQueue     = (*Store)(nil)
	_ seams.RunCanceller = (*Store)(nil)
	_ seams.RunDescriber = (*Store)(nil)
)

// queueQueries are the queue's statements (queries), with sub filling in
// the schema.
func queueQueries(sub func(string) string, q *queries) {
	// Up to $2 runs of the agents $1 that are claimable — unfinished,
	// nobody live holds them, their retry time come — free ones first,
	// then those whose lease ran out, each leased to owner $3 for $4
	// microseconds: the runs and their agents, oldest first. The two
	// selects read two ranges of the partial index runs_claimable (a free
	// run's expiry is NULL, an expired one's before now), never a row a
	// live lease holds nor a finished run's, and skip the rows another
	// claim (or an append) has locked, so two claimers never wait for each
	// other nor get one run; a row changed since the statement began is
	// checked again as it now stands. $5 are runs a
	// driver of this store is letting go of: their leases are already
	// given back on the server, but the store still reserves them, so a
	// claim of one could not be locked.
	q.claim = sub(`WITH free AS (
	SELECT run_id FROM {{schema}}.runs
	WHERE status = 'running' AND agent IS NOT NULL AND lease_expires IS NULL
		AND agent = ANY($1::text[]) AND (retry_at IS NULL OR retry_at <= now()) AND run_id <> ALL($5::text[])
	LIMIT $2
	FOR UPDATE SKIP LOCKED
), expired AS (
	SELECT run_id FROM {{schema}}.runs
	WHERE status = 'running' AND agent IS NOT NULL AND lease_expires <= now()
		AND agent = ANY($1::text[]) AND (retry_at IS NULL OR retry_at <= now()) AND run_id <> ALL($5::text[])
	ORDER BY lease_expires NULLS FIRST
	LIMIT $2
	FOR UPDATE SKIP LOCKED
), c AS (
	UPDATE {{schema}}.runs SET lease_owner = $3, lease_expires = now() + $4::bigint * interval '1 microsecond'
	WHERE run_id IN (SELECT run_id FROM (SELECT run_id, 0 AS k FROM free UNION ALL SELECT run_id, 1 FROM expired) t ORDER BY k LIMIT $2)
	RETURNING run_id, agent, first_event)
SELECT run_id, agent FROM c ORDER BY first_event, run_id`)
	// Run $1 given back by owner $2 (or already released), when it is
	// unfinished and queued: claimable again $4 microseconds from now (at
	// once for 0); with a failure ($3 not null) that is recorded and
	// counted.
	q.giveBack = sub(`UPDATE {{schema}}.runs SET lease_owner = NULL, lease_expires = NULL,
	failures = failures + CASE WHEN $3::text IS NULL THEN 0 ELSE 1 END,
	last_error = coalesce($3::text, last_error),
	retry_at = CASE WHEN $3::text IS NULL AND $4::bigint = 0 THEN NULL ELSE now() + $4::bigint * interval '1 microsecond' END
WHERE run_id = $1 AND status = 'running' AND agent IS NOT NULL AND (lease_owner IS NULL OR lease_owner = $2)`)
	// Run $1 handed back to the workers by an operator, when it is queued,
	// unfinished and nobody live holds it.
	q.requeue = sub(`UPDATE {{schema}}.runs SET lease_owner = NULL, lease_expires = NULL, failures = 0, last_error = NULL, retry_at = NULL
WHERE run_id = $1 AND status = 'running' AND agent IS NOT NULL AND (lease_owner IS NULL OR lease_expires <= now())`)
	// What RequeueRun refused: the run's status, whether it has an agent,
	// and its live holder (nulls when nobody holds it live).
	q.queued = sub(`SELECT status, agent IS NOT NULL,
	CASE WHEN lease_expires > now() THEN lease_owner END, CASE WHEN lease_expires > now() THEN lease_expires END
FROM {{schema}}.runs WHERE run_id = $1`)
	// Run $1's cancel request, by $2 at the server's now, unless one is
	// recorded already: the request that stays and the live holder.
	q.requestCancel = sub(`UPDATE {{schema}}.runs SET cancel_by = coalesce(cancel_by, $2), cancel_at = coalesce(cancel_at, now())
WHERE run_id = $1 AND status = 'running'
RETURNING cancel_by, cancel_at, CASE WHEN lease_expires > now() THEN lease_owner END`)
	// Run $1's cancel request (no row: a run never written).
	q.cancelOf = sub(`SELECT ` + cancelColumns("") + ` FROM {{schema}}.runs WHERE run_id = $1`)
	// Run $1's index row, its coordination and the server's now.
	q.describe = sub(`SELECT ` + rowColumns("") + `, ` + coordColumns + `, now() FROM {{schema}}.runs WHERE run_id = $1`)
}

// coordColumns are a runs row's coordination columns in the order
// coordScan takes them: what a listing shows beside the run's entry. A
// finished run has left the queue: its columns read null (an agent,
// failures and last error the row keeps from before are moot), as kv,
// which removes a finished run's queue entry, lists it.
var coordColumns = func() string {
	var cols []string
	for _, c := range []string{"agent", "lease_owner", "lease_expires", "failures", "last_error", "retry_at"} {
		cols = append(cols, "CASE WHEN status = 'running' THEN "+c+" END AS "+c)
	}
	return strings.Join(cols, ", ") + ", " + cancelColumns("")
}()

// coordNulls stands for coordColumns where a listing has no row.
const coordNulls = "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL"

// coordScan receives coordColumns.
type coordScan struct {
	agent, owner, lastError, cancelBy *string
	expires, retryAt, cancelAt        *time.Time
	failures                          *int64
}

func (c *coordScan) dest() []any {
	return []any{&c.agent, &c.owner, &c.expires, &c.failures, &c.lastError, &c.retryAt, &c.cancelBy, &c.cancelAt}
}

// fill sets info's coordination fields from the columns.
func (c *coordScan) fill(info *seams.RunInfo) {
	str := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	tm := func(p *time.Time) time.Time {
		if p == nil {
			return time.Time{}
		}
		return *p
	}
	info.Agent, info.Owner, info.LeaseExpires = str(c.agent), str(c.owner), tm(c.expires)
	info.LastError, info.RetryAt = str(c.lastError), tm(c.retryAt)
	info.Failures = 0
	if c.failures != nil {
		info.Failures = int(*c.failures)
	}
	info.CancelRequested = cancelRequest(c.cancelBy, c.cancelAt)
}

// releasing lists the runs a driver of this store is letting go of (its
// lease lost or given back, its reservation not yet forgotten).
func (s *Store) releasing() []string {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	out := []string{}
	for id, l := range s.leases {
		l.mu.Lock()
		if l.lost != nil {
			out = append(out, id)
		}
		l.mu.Unlock()
	}
	return out
}

// ClaimRuns implements seams.RunQueue in one statement: up to max
// unfinished runs of the named agents that nobody live holds and whose
// retry time has come, oldest first, each leased to this store (its owner
// and an expiry of now plus the lease term, as LockRun leases it), read
// from the partial index of unfinished runs with an agent. LockRun of a
// claimed run then succeeds for this store; until it does, nothing renews
// the claim's lease, which expires after one term (the run is then
// claimable again). An agent name seams.ValidAgent refuses is an error.
func (s *Store) ClaimRuns(ctx context.Context, agents []string, max int) ([]seams.Claim, error) {
	if s.readOnly {
		return nil, ErrReadOnly
	}
	if len(agents) == 0 || max < 1 {
		return nil, nil
	}
	for _, a := range agents {
		if err := seams.ValidAgent(a); err != nil {
			return nil, fmt.Errorf("pgstore: claim runs: %w", err)
		}
	}
	if s.isClosed() {
		return nil, fmt.Errorf("pgstore: claim runs: %w", errClosed)
	}
	claims, err := retry(ctx, func() ([]seams.Claim, error) {
		rows, err := s.pool.Query(ctx, s.q.claim, agents, max, s.owner, s.leaseTerm.Microseconds(), s.releasing())
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, pgx.RowToStructByPos[seams.Claim])
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: claim runs of %s: %w", strings.Join(agents, ", "), err)
	}
	return claims, nil
}

// ReleaseRun implements seams.RunQueue in one statement: the run's lease
// is cleared when it is this store's or already released, and the run is
// claimable again after retry (at once for 0: its retry time cleared);
// with a failure, its failure count goes up, the failure is kept as its last error (valid
// UTF-8, at most events.MaxEnvErrorBytes, cut and marked with "…"), and it
// is claimable again after retry by the server's clock. A run another
// worker holds, one a driver of this store still holds (its LockRun not
// released), a finished run, a run started without an agent and a run the
// store does not hold are left as they are (nil error); a negative retry
// is an error.
func (s *Store) ReleaseRun(ctx context.Context, runID, failure string, retryAfter time.Duration) error {
	if s.readOnly {
		return ErrReadOnly
	}
	if err := seams.ValidRunID(runID); err != nil {
		return fmt.Errorf("pgstore: release run: %w", err)
	}
	if retryAfter < 0 {
		return fmt.Errorf("pgstore: release run %q: the retry delay %v is negative (want 0 or more)", runID, retryAfter)
	}
	if l := s.leaseOf(runID); l != nil {
		l.mu.Lock()
		driven := l.lost == nil
		l.mu.Unlock()
		if driven {
			return nil // a driver of this store holds it
		}
	}
	var text *string
	if failure != "" {
		text = events.EnvErrorText(strings.ReplaceAll(strings.ToValidUTF8(failure, "\uFFFD"), "\x00", "\uFFFD"))
	}
	_, err := retry(ctx, func() (struct{}, error) {
		_, err := s.pool.Exec(ctx, s.q.giveBack, runID, s.owner, text, retryAfter.Microseconds())
		return struct{}{}, err
	})
	if err != nil {
		return fmt.Errorf("pgstore: release run %q: %w", runID, err)
	}
	return nil
}

// RequeueRun implements seams.RunQueue in one statement: the run's retry
// time, failure count and last error are cleared, and so is a holder
// whose lease ran out. A refusal is explained by reading the run's row.
func (s *Store) RequeueRun(ctx context.Context, runID string) error {
	if s.readOnly {
		return ErrReadOnly
	}
	if err := seams.ValidRunID(runID); err != nil {
		return fmt.Errorf("pgstore: requeue run: %w", err)
	}
	for attempt := 1; ; attempt++ {
		n, err := retry(ctx, func() (int64, error) {
			tag, err := s.pool.Exec(ctx, s.q.requeue, runID)
			return tag.RowsAffected(), err
		})
		if err != nil {
			return fmt.Errorf("pgstore: requeue run %q: %w", runID, err)
		}
		if n == 1 {
			return nil
		}
		var (
			status  string
			queued  bool
			owner   *string
			expires *time.Time
		)
		_, err = retry(ctx, func() (struct{}, error) {
			return struct{}{}, s.pool.QueryRow(ctx, s.q.queued, runID).Scan(&status, &queued, &owner, &expires)
		})
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("pgstore: requeue run %q: %w", runID, seams.ErrNoRun)
		case err != nil:
			return fmt.Errorf("pgstore: requeue run %q: %w", runID, err)
		case status != string(seams.StatusRunning):
			return fmt.Errorf("pgstore: requeue run %q: %w", runID, seams.ErrRunFinished)
		case !queued:
			return fmt.Errorf("pgstore: requeue run %q: %w", runID, seams.ErrNotQueued)
		case owner != nil && expires != nil:
			return fmt.Errorf("pgstore: requeue run %q: %w (%s, lease until %s)", runID, seams.ErrRunLocked, *owner, stamp(*expires))
		case attempt == 3:
			return fmt.Errorf("pgstore: requeue run %q: its lease changed hands three times while being requeued: %w", runID, seams.ErrRunLocked)
		}
		// Its holder's lease ran out or was given back between the two
		// statements: again.
	}
}

// MaxCancelByBytes bounds the requester's name RequestCancel records.
const MaxCancelByBytes = 1 << 10

// RequestCancel implements seams.RunCanceller in one statement, durable on
// commit: the request by by, at the server's now, unless one is recorded
// (the first stays), and the run's live holder. When this store holds the
// run, its CancelRequested sees the request at once. by must be text
// PostgreSQL can hold (valid UTF-8 without NUL), of at most
// MaxCancelByBytes.
func (s *Store) RequestCancel(ctx context.Context, runID, by string) (string, error) {
	if s.readOnly {
		return "", ErrReadOnly
	}
	if err := seams.ValidRunID(runID); err != nil {
		return "", fmt.Errorf("pgstore: request cancel: %w", err)
	}
	switch {
	case len(by) > MaxCancelByBytes:
		return "", fmt.Errorf("pgstore: request cancel of run %q: the requester's name is %d bytes, more than %d", runID, len(by), MaxCancelByBytes)
	case !utf8Text(by):
		return "", fmt.Errorf("pgstore: request cancel of run %q: the requester's name %q is not valid UTF-8 without NUL", runID, by)
	}
	var (
		reqBy  string
		reqAt  time.Time
		holder *string
	)
	_, err := retry(ctx, func() (struct{}, error) {
		return struct{}{}, s.pool.QueryRow(ctx, s.q.requestCancel, runID, by).Scan(&reqBy, &reqAt, &holder)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		h, herr := s.holder(ctx, runID)
		switch {
		case herr != nil:
			return "", fmt.Errorf("pgstore: request cancel of run %q: %w", runID, herr)
		case !h.exists:
			return "", fmt.Errorf("pgstore: request cancel of run %q: %w", runID, seams.ErrNoRun)
		}
		return "", fmt.Errorf("pgstore: request cancel of run %q: %w", runID, seams.ErrRunFinished)
	}
	if err != nil {
		return "", fmt.Errorf("pgstore: request cancel of run %q: %w", runID, err)
	}
	if l := s.leaseOf(runID); l != nil {
		l.mu.Lock()
		l.noteCancel(&seams.CancelRequest{By: reqBy, At: reqAt})
		l.mu.Unlock()
	}
	if holder == nil {
		return "", nil
	}
	return *holder, nil
}

// CancelRequested implements seams.RunCanceller. For a run this store
// holds (LockRun, its lease not lost) it answers from the lease, without
// a statement: what taking the run, its last append or its last renewal
// read back, or what RequestCancel through this store recorded. For any
// other run it reads the run's row. A finished run, and a run never
// written, have none.
func (s *Store) CancelRequested(ctx context.Context, runID string) (*seams.CancelRequest, error) {
	if err := seams.ValidRunID(runID); err != nil {
		return nil, fmt.Errorf("pgstore: cancel requested: %w", err)
	}
	if l := s.leaseOf(runID); l != nil {
		l.mu.Lock()
		c, held := l.cancel, l.lost == nil
		l.mu.Unlock()
		if held {
			if c == nil {
				return nil, nil
			}
			req := *c
			return &req, nil
		}
	}
	var (
		by *string
		at *time.Time
	)
	_, err := retry(ctx, func() (struct{}, error) {
		return struct{}{}, s.pool.QueryRow(ctx, s.q.cancelOf, runID).Scan(&by, &at)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("pgstore: cancel requested of run %q: %w", runID, err)
	}
	return cancelRequest(by, at), nil
}

// Describe implements seams.RunDescriber in one statement: the run's
// index row as Runs lists it, coordination included, its liveness by the
// server's clock. A run whose events have no index row is listed with
// seams.StatusCorrupt, as Runs lists it (a second statement finds them).
func (s *Store) Describe(ctx context.Context, runID string) (seams.RunInfo, error) {
	if err := seams.ValidRunID(runID); err != nil {
		return seams.RunInfo{}, fmt.Errorf("pgstore: describe: %w", err)
	}
	var (
		sc  rowScan
		co  coordScan
		now time.Time
	)
	_, err := retry(ctx, func() (struct{}, error) {
		return struct{}{}, s.pool.QueryRow(ctx, s.q.describe, runID).Scan(append(append(sc.dest(), co.dest()...), &now)...)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		found, err := s.HasRun(ctx, runID)
		switch {
		case err != nil:
			return seams.RunInfo{}, fmt.Errorf("pgstore: describe run %q: %w", runID, err)
		case found:
			return seams.RunInfo{RunID: runID, Status: seams.StatusCorrupt}, nil
		}
		return seams.RunInfo{}, fmt.Errorf("pgstore: describe run %q: %w", runID, seams.ErrNoRun)
	case err != nil:
		return seams.RunInfo{}, fmt.Errorf("pgstore: describe run %q: %w", runID, err)
	}
	return listed(&sc, &co, now), nil
}

// listed is a run's entry as Runs and Describe give it: the index row
// (only the id and StatusCorrupt when the row is damaged), its
// coordination, and its liveness at now.
func listed(sc *rowScan, co *coordScan, now time.Time) seams.RunInfo {
	row, _, err := sc.row()
	if err != nil || sc.status == nil {
		row.info = seams.RunInfo{RunID: *sc.runID, Status: seams.StatusCorrupt}
	}
	info := row.info
	co.fill(&info)
	info.Liveness(now)
	return info
}

// utf8Text reports whether PostgreSQL's text can hold s: valid UTF-8
// without NUL.
func utf8Text(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// isClosed reports whether Close began.
func (s *Store) isClosed() bool {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	return s.closed
}
