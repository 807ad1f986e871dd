// Package retention deletes old runs from any store that can
// (seams.RunDeleter): the policy a long-lived service runs now and then,
// and what `polyloop-admin gc` does. Deleting is a store's own rule
// (DeleteRun): a run a driver holds is never deleted, an unfinished one
// only with force.
//
// Preview and Check say what Expire and DeleteRun would do, deleting
// nothing: a dry run (`polyloop-admin gc --dry-run`, `delete --dry-run`)
// reads the store's listing — each run's status and who holds it now —
// and writes nothing. What they say holds at the moment they read; a
// driver may take a run, or a run finish, before a real pass. A finished
// run is held only while a Resume returns its result, and a PostgreSQL
// store lists no holder for a finished run: a dry run counts such a run
// as deletable, where the real pass would leave it for the next.
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

// Preview is what Expire would do now with cutoff, deleting nothing:
// Deleted lists the finished runs before cutoff it would delete, Busy
// those of them a driver holds now (seams.RunInfo.Liveness: a holder
// whose lease has not run out), Damaged the runs the store lists damaged.
// A run whose entry says finished but whose stream the store would find
// unfinished (Expire's other Damaged) shows only in a real pass.
func Preview(ctx context.Context, s seams.RunReader, cutoff time.Time) (Result, error) {
	var res Result
	runs, err := s.Runs(ctx)
	if err != nil {
		return res, fmt.Errorf("retention: list runs: %w", err)
	}
	now := time.Now()
	for _, r := range runs {
		switch {
		case r.Status == seams.StatusCorrupt:
			res.Damaged = append(res.Damaged, r.RunID)
		case r.Status != seams.StatusFinished || !r.LastEvent.Before(cutoff):
		case held(r, now):
			res.Busy = append(res.Busy, r.RunID)
		default:
			res.Deleted = append(res.Deleted, r.RunID)
		}
	}
	return res, nil
}

// Check is what DeleteRun(ctx, runID, force) would say now, deleting
// nothing: nil when it would delete the run; an error wrapping
// seams.ErrRunLocked for a run a driver holds, seams.ErrNoRun for a run
// the store does not list, seams.ErrRunNotFinished for an unfinished or
// damaged run without force (a damaged one's error joins the damage to
// it, as the stores' DeleteRun does).
func Check(ctx context.Context, s seams.RunReader, runID string, force bool) error {
	info, err := entry(ctx, s, runID)
	if err != nil {
		return err
	}
	switch {
	case held(info, time.Now()):
		return fmt.Errorf("run %q: %w: %s holds it", runID, seams.ErrRunLocked, info.Owner)
	case force:
		return nil
	case info.Status == seams.StatusCorrupt:
		return fmt.Errorf("run %q: %w (%w)", runID, seams.ErrRunNotFinished, errListedDamaged)
	case info.Status != seams.StatusFinished:
		return fmt.Errorf("run %q: %w", runID, seams.ErrRunNotFinished)
	}
	return nil
}

// errListedDamaged is the damage Check names for a run the store lists
// damaged (seams.StatusCorrupt): what its entry or stream holds wrong is
// polyloop-inspect verify's to say.
var errListedDamaged = errors.New("the store lists it damaged")

// entry is runID's listing: seams.RunDescriber.Describe where s is one,
// else its entry among s.Runs.
func entry(ctx context.Context, s seams.RunReader, runID string) (seams.RunInfo, error) {
	if d, ok := s.(seams.RunDescriber); ok {
		info, err := d.Describe(ctx, runID)
		if err != nil && !errors.Is(err, seams.ErrNoRun) && !errors.Is(err, seams.ErrInvalidRunID) {
			return info, fmt.Errorf("retention: describe run %q: %w", runID, err)
		}
		if err != nil {
			return info, fmt.Errorf("run %q: %w", runID, seams.ErrNoRun)
		}
		return info, nil
	}
	runs, err := s.Runs(ctx)
	if err != nil {
		return seams.RunInfo{}, fmt.Errorf("retention: list runs: %w", err)
	}
	for _, r := range runs {
		if r.RunID == runID {
			return r, nil
		}
	}
	return seams.RunInfo{}, fmt.Errorf("run %q: %w", runID, seams.ErrNoRun)
}

// held reports whether a driver holds the run of entry r at now: a holder
// named whose lease has not run out (a hold without a term lasts as long
// as its process), as seams.RunInfo.Liveness judges a running entry.
func held(r seams.RunInfo, now time.Time) bool {
	r.Status = seams.StatusRunning
	r.Liveness(now)
	return r.Status == seams.StatusRunning
}
