package kv

import (
	"context"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/seams"
)

var _ seams.RunDeleter = (*Store)(nil)

// DeleteRun implements seams.RunDeleter: the run's events (in the log,
// every event its links reach, and its first-key record; in a format 1
// file, its bucket), its index entry and its queue entry go in one
// transaction. The run is reserved (RunLocks) while it is
// deleted, so a run being driven in this process is refused, and no driver
// starts on it meanwhile; other processes cannot open the file at all. A
// run whose index entry is damaged counts as unfinished. The freed pages
// are reused by later appends, so a store whose old runs are deleted stops
// growing (Compact shrinks the file itself).
func (s *Store) DeleteRun(ctx context.Context, runID string, force bool) error {
	if s.readOnly {
		return ErrReadOnly
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.checkOpen(); err != nil {
		return err
	}
	release, err := s.LockRun(runID)
	if err != nil {
		return fmt.Errorf("kv: delete run %q: %w", runID, err)
	}
	defer release()
	var undo func()
	err = withFaultsAsPanics(func() error {
		return s.db.Update(func(tx *bolt.Tx) error {
			index := tx.Bucket(indexBucket)
			if index == nil {
				return fmt.Errorf("%w: %s: the index bucket is missing", ErrCorrupt, s.path)
			}
			key := s.layout.entryKey(tx, runID) // before remove: in the log it is the run's first key
			info, indexed, ierr := readInfo(index, key, runID)
			switch {
			case !indexed && !s.layout.exists(tx, runID):
				if err := s.lost(tx, runID); err != nil {
					return fmt.Errorf("%w: %w", ErrCorrupt, err)
				}
				return seams.ErrNoRun
			case !force && ierr != nil:
				return fmt.Errorf("%w (its index entry is damaged: %w)", seams.ErrRunNotFinished, ierr)
			case !force && info.Status != StatusFinished:
				return seams.ErrRunNotFinished
			}
			if err := s.layout.remove(tx, runID, info, indexed && ierr == nil); err != nil {
				return err
			}
			s.written.forget(runID)
			if queue := tx.Bucket(queueBucket); queue != nil && queue.Get([]byte(runID)) != nil {
				if err := queue.Delete([]byte(runID)); err != nil {
					return err
				}
				undo = s.cancels.put(runID, nil)
			}
			if indexed {
				return index.Delete(key)
			}
			return nil
		})
	})
	if err != nil {
		if undo != nil {
			undo()
		}
		return fmt.Errorf("kv: delete run %q: %w", runID, err)
	}
	s.txCount.Add(1)
	return nil
}
