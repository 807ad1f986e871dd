package pgstore

import (
	"context"
	"fmt"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

var _ seams.RunDeleter = (*Store)(nil)

// DeleteRun implements seams.RunDeleter: the run's index row and then its
// events, in one statement. The run is reserved with its lease (LockRun)
// while it is deleted, so a run driven by any live worker is refused and
// none starts on it meanwhile. Without force, the run must be finished by its
// stream's word, not its index row's alone: the row must sum to its
// checksum and say finished, and the stream's last event — the one the
// row names, its checksum verified — must be run_finished; a run whose
// row or stream says otherwise is refused with seams.ErrRunNotFinished,
// wrapping ErrCorrupt when they disagree. PostgreSQL reuses the space
// after its autovacuum; VACUUM FULL gives it back to the disk.
func (s *Store) DeleteRun(ctx context.Context, runID string, force bool) error {
	if s.readOnly {
		return ErrReadOnly
	}
	release, err := s.LockRun(runID)
	if err != nil {
		return fmt.Errorf("pgstore: delete run %q: %w", runID, err)
	}
	defer release()
	q := s.pool
	var last ulid.ULID
	var sum uint32
	if !force {
		row, err := s.finished(ctx, q, runID)
		if err != nil {
			return fmt.Errorf("pgstore: delete run %q: %w", runID, err)
		}
		last, sum = row.info.LastID, row.crc
	}
	var runs, evs int64
	err = q.QueryRow(ctx, s.q.delete, runID, force, last[:], int64(sum)).Scan(&runs, &evs)
	switch {
	case err != nil:
		return fmt.Errorf("pgstore: delete run %q: %w", runID, err)
	case runs == 1 || evs > 0:
		return nil
	case force:
		return fmt.Errorf("pgstore: delete run %q: %w", runID, seams.ErrNoRun)
	}
	return fmt.Errorf("pgstore: delete run %q: %w: its index row changed while it was being deleted", runID, seams.ErrRunNotFinished)
}

// finished is runID's index row when the run is finished by its stream's
// word (DeleteRun), read through q; otherwise seams.ErrNoRun or
// seams.ErrRunNotFinished, the latter wrapping ErrCorrupt too when the row
// is damaged or the stream contradicts it.
func (s *Store) finished(ctx context.Context, q session, runID string) (indexRow, error) {
	var (
		sc    rowScan
		seq   *int64
		id    []byte
		value []byte
	)
	err := q.QueryRow(ctx, s.q.deletable, runID).Scan(append(sc.dest(), &seq, &id, &value)...)
	if err != nil {
		return indexRow{}, err
	}
	row, indexed, rowErr := sc.row()
	damaged := func(format string, a ...any) error {
		// The damage is an error of its own beside the refusal, so a
		// command can say it without the refusal's words again.
		return fmt.Errorf("%w (%w)", seams.ErrRunNotFinished, fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, a...)...))
	}
	switch {
	case !indexed && seq == nil:
		return indexRow{}, seams.ErrNoRun
	case !indexed:
		return indexRow{}, damaged("run %q has %d events but no index row", runID, *seq)
	case rowErr != nil:
		return indexRow{}, damaged("%w", rowErr)
	case row.info.Status != seams.StatusFinished:
		return indexRow{}, seams.ErrRunNotFinished
	case seq == nil || *seq != int64(row.info.Events) || len(id) != 16 || ulid.ULID(id) != row.info.LastID:
		return indexRow{}, damaged("its index row says finished after %d events ending with %s, but its stream does not end there", row.info.Events, row.info.LastID)
	}
	env, err := events.Unmarshal(runID, row.info.LastID, value)
	switch {
	case err != nil:
		return indexRow{}, damaged("its index row says finished, and its last event does not decode: %w", err)
	case env.Kind != events.KindRunFinished:
		return indexRow{}, damaged("its index row says finished, its stream's last event is %s", env.Kind)
	}
	return row, nil
}
