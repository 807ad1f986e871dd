package pgstore

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

var _ seams.RunForker = (*Store)(nil)

// ForkRun implements seams.RunForker in one transaction: it refuses a run
// that has a row or events (seams.ErrRunExists), reads the source's index
// row (a damaged one refuses the fork with ErrCorrupt) and its events up
// to through, in order, decoding each (its checksum verified), then
// inserts the started event and the copied values resealed under keys
// minted for runID, with the run's index row summing them
// (seams.RunInfo.Apply, checksummed as every row) and the agent it is
// queued for — the statement an Append starting a run runs, so of a fork
// and a start racing for one id exactly one is written. A driver that
// reserved runID (LockRun: a run without a row is reserved in this
// process) gets the lease on the new row, as with a start, and drives the
// fork on from the events returned.
func (s *Store) ForkRun(ctx context.Context, runID string, started events.RunStarted, source string, through ulid.ULID, n int) ([]events.Envelope, error) {
	if s.readOnly {
		return nil, ErrReadOnly
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for _, id := range []string{runID, source} {
		if err := seams.ValidRunID(id); err != nil {
			return nil, fmt.Errorf("pgstore: fork: %w", err)
		}
	}
	if started.RunID != runID {
		return nil, fmt.Errorf("pgstore: fork %q: its run_started names run %q", runID, started.RunID)
	}
	var agent *string
	if started.Agent != "" {
		if err := seams.ValidAgent(started.Agent); err != nil {
			return nil, fmt.Errorf("pgstore: fork %q: run_started: %w", runID, err)
		}
		agent = &started.Agent
	}
	first, err := events.Marshal(started)
	if err != nil {
		return nil, fmt.Errorf("pgstore: fork %q: %w", runID, err)
	}
	if s.isClosed() {
		return nil, fmt.Errorf("pgstore: fork %q: %w", runID, errClosed)
	}
	l := s.leaseOf(runID)
	var owner *string // the lease the fork's row carries, if any
	if l != nil {
		l.mu.Lock()
		lost := l.lost
		l.mu.Unlock()
		if lost != nil {
			return nil, lost
		}
		owner = &s.owner
	}
	var (
		envs []events.Envelope
		next indexRow
		sent = time.Now()
	)
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var exists bool
		if err := tx.QueryRow(ctx, s.q.has, runID).Scan(&exists); err != nil {
			return err
		}
		if exists {
			return fmt.Errorf("fork onto %q: %w", runID, seams.ErrRunExists)
		}
		prefix, vals, err := s.prefix(ctx, tx, source, through, n)
		if err != nil {
			return err
		}
		ids, kinds, crcs := make([][]byte, 1+n), make([]string, 1+n), make([]int64, 1+n)
		envs = make([]events.Envelope, 1+n)
		info := seams.RunInfo{RunID: runID}
		now, tail := s.clock(), ulid.ULID{}
		for i := range vals {
			env := events.Envelope{Kind: started.Kind(), SchemaVersion: events.CurrentSchemaVersion, Event: started}
			if i == 0 {
				vals[0] = first
			} else {
				env = prefix[i]
			}
			tail = s.ids.NextAfter(now, tail)
			if err := events.Reseal(vals[i], runID, tail); err != nil {
				return err
			}
			sum, _ := events.SealedChecksum(vals[i])
			id := tail
			ids[i], kinds[i], crcs[i] = id[:], string(env.Kind), int64(sum)
			env.ID = tail
			envs[i] = env
			info.Apply(env)
		}
		next = newRow(info)
		tag, err := tx.Exec(ctx, s.q.start, runID, ids, kinds, vals, crcs,
			string(info.Status), info.Steps, info.Events, string(info.StopReason), info.LastEvent, info.LastID[:], info.FirstEvent, int64(next.crc),
			owner, s.leaseTerm.Microseconds(), agent)
		switch {
		case err != nil:
			return err
		case tag.RowsAffected() != int64(len(vals)):
			// A start of the run committed since it was looked for.
			return fmt.Errorf("fork onto %q: %w", runID, seams.ErrRunExists)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: fork %q from %q (nothing was written unless the commit's answer was lost; Load tells): %w", runID, source, err)
	}
	if l != nil {
		l.mu.Lock()
		switch {
		case l.lost != nil: // a lease released meanwhile keeps its verdict
		case next.info.Status == seams.StatusFinished: // a finished run carries no lease
			l.row, l.onServer, l.lost = &next, false, fmt.Errorf("run %q: %w: it is finished", runID, seams.ErrRunFinished)
		default:
			l.row, l.onServer, l.valid = &next, true, sent.Add(s.leaseTerm)
		}
		l.mu.Unlock()
	}
	return envs, nil
}

// prefix reads, in tx, source's index row and its events up to through
// (its RunStarted alone for a zero through), in order, and returns them
// decoded with copies of their values: ErrForkPrefix unless through is
// the stream's event n+1 (n events after RunStarted), seams.ErrNoRun for a
// run the store does not hold, ErrCorrupt for a damaged row or value.
// It checks less than Load: each value's own checksum, the sequence and
// the key order, not the crc and kind columns nor the row's count and
// last key against the whole stream (which it does not read).
func (s *Store) prefix(ctx context.Context, tx pgx.Tx, source string, through ulid.ULID, n int) ([]events.Envelope, [][]byte, error) {
	if n < 0 || through == (ulid.ULID{}) && n != 0 {
		return nil, nil, fmt.Errorf("fork from %q: %d events up to %s: %w", source, n, through, seams.ErrForkPrefix)
	}
	_, found, err := s.readRow(ctx, tx, source)
	if err != nil {
		return nil, nil, err
	}
	rows, err := tx.Query(ctx, s.q.prefix, source, int64(n+1))
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	r := events.StreamReader{RunID: source}
	var (
		vals [][]byte
		last ulid.ULID
		seq  int64
		id   []byte
		val  []byte
	)
	for rows.Next() {
		if err := rows.Scan(&seq, &id, &val); err != nil {
			return nil, nil, err
		}
		switch {
		case seq != int64(len(vals)+1):
			r.Problem(fmt.Errorf("event %d is stored as number %d: events are missing or were added", len(vals)+1, seq))
		case len(id) != 16:
			r.Problem(fmt.Errorf("event %d: key %x is not a ULID", seq, id))
		case ulid.ULID(id).Compare(last) <= 0:
			r.Problem(fmt.Errorf("event %d: key %s does not follow %s", seq, ulid.ULID(id), last))
		default:
			last = ulid.ULID(id)
			r.Value(last, val)
		}
		vals = append(vals, slices.Clone(val))
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	switch {
	case !found && len(vals) == 0:
		return nil, nil, fmt.Errorf("fork from %q: %w", source, seams.ErrNoRun)
	case !found:
		return nil, nil, fmt.Errorf("fork from %q: %w: it has events but no index row", source, ErrCorrupt)
	}
	prefix, err := r.Stream()
	if err != nil {
		return nil, nil, fmt.Errorf("fork from %q: %w: %w", source, ErrCorrupt, err)
	}
	if through != (ulid.ULID{}) && (len(prefix) != n+1 || last != through) {
		return nil, nil, fmt.Errorf("fork from %q: %s is not its event %d (%d events after its start): %w", source, through, n+1, n, seams.ErrForkPrefix)
	}
	if len(prefix) == 0 {
		return nil, nil, fmt.Errorf("fork from %q: %w: its index row has no events", source, ErrCorrupt)
	}
	return prefix, vals, nil
}
