package pgstore

import (
	"context"
	"fmt"

	"github.com/polyloop/polyloop/seams"
)

var _ seams.RunDeleter = (*Store)(nil)

// DeleteRun implements seams.RunDeleter in one statement: the run's index
// row (only when finished, or forced) and then its events. The run is
// reserved with its advisory lock while it is deleted, so a run driven by
// any worker is refused and none starts on it meanwhile. PostgreSQL reuses
// the space after its autovacuum; VACUUM FULL gives it back to the disk.
func (s *Store) DeleteRun(ctx context.Context, runID string, force bool) error {
	if s.readOnly {
		return ErrReadOnly
	}
	release, err := s.LockRun(runID)
	if err != nil {
		return fmt.Errorf("pgstore: delete run %q: %w", runID, err)
	}
	defer release()
	q, done := s.sessionFor(runID)
	defer done()
	var runs, evs int64
	err = q.QueryRow(ctx, s.q.delete, runID, force).Scan(&runs, &evs)
	switch {
	case err != nil:
		return fmt.Errorf("pgstore: delete run %q: %w", runID, err)
	case runs == 1 || evs > 0:
		return nil
	}
	var status string
	if err := q.QueryRow(ctx, `SELECT status FROM `+s.q.runsTable+` WHERE run_id = $1`, runID).Scan(&status); err != nil {
		return fmt.Errorf("pgstore: delete run %q: %w", runID, seams.ErrNoRun)
	}
	return fmt.Errorf("pgstore: delete run %q: %w", runID, seams.ErrRunNotFinished)
}
