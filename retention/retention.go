// Package retention deletes old runs from any store that can
// (seams.RunDeleter): the policy a long-lived service runs now and then,
// and what `polyloop-admin gc` does. Deleting is a store's own rule
// (DeleteRun): a run a driver holds is never deleted, an unfinished one
// only with force.
//
// What does not live here: the deletion itself (the stores) and reading
// (package report).
package retention

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/polyloop/polyloop/seams"
)

// Store is a store with retention.
type Store interface {
	seams.RunReader
	seams.RunDeleter
}

// Result says what Expire did.
type Result struct {
	Deleted []string // run ids deleted
	Busy    []string // finished runs a driver held (a Resume returning the result): left for the next pass
	// Damaged are runs the store lists damaged, or would not delete as
	// finished although it listed them so (the run's stream contradicts
	// its index entry — or, rarely, the run was deleted and started again
	// in between): left alone, for `polyloop-inspect verify` to explain.
	Damaged []string
}

// Expire deletes every finished run whose last event is before cutoff.
// Unfinished runs are never touched (a crashed run may still be resumed;
// delete one on purpose with DeleteRun and force), nor damaged ones (listed
// in Damaged). A run held by a driver is skipped and listed in Busy. It
// stops at the first other error, returning what it deleted so far.
func Expire(ctx context.Context, s Store, cutoff time.Time) (Result, error) {
	var res Result
	runs, err := s.Runs(ctx)
	if err != nil {
		return res, fmt.Errorf("retention: list runs: %w", err)
	}
	for _, r := range runs {
		if r.Status == seams.StatusCorrupt {
			res.Damaged = append(res.Damaged, r.RunID)
		}
		if r.Status != seams.StatusFinished || !r.LastEvent.Before(cutoff) {
			continue
		}
		switch err := s.DeleteRun(ctx, r.RunID, false); {
		case err == nil:
			res.Deleted = append(res.Deleted, r.RunID)
		case errors.Is(err, seams.ErrRunLocked):
			res.Busy = append(res.Busy, r.RunID)
		case errors.Is(err, seams.ErrRunNotFinished):
			res.Damaged = append(res.Damaged, r.RunID)
		case errors.Is(err, seams.ErrNoRun):
			// deleted meanwhile by someone else
		default:
			return res, fmt.Errorf("retention: %w", err)
		}
	}
	return res, nil
}
