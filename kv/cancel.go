package kv

import (
	"sync"

	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/seams"
)

// cancelState is what this Store knows of a run's cancel request: the
// request (nil: none), or that the run's queue entry is damaged, so
// whether one was made is unknown.
type cancelState struct {
	req     *seams.CancelRequest
	damaged error
}

// cancels mirrors the cancel requests of the file's queue entries, and
// the damaged entries, by run id, so CancelRequested answers from memory:
// loaded at Open, and kept by every write of an entry inside the
// transaction that writes it (bbolt serializes them, so the mirror changes
// in the order the file does), undone when that transaction does not
// commit. No other process writes the file while this Store has it open.
type cancels struct {
	mu sync.RWMutex
	m  map[string]cancelState
}

// get is runID's state; ok false when there is no request and no damage.
func (c *cancels) get(runID string) (cancelState, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	st, ok := c.m[runID]
	return st, ok
}

// put makes runID's state st (nil: no request, no damage), and returns
// what undoes that.
func (c *cancels) put(runID string, st *cancelState) (undo func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old, had := c.m[runID]
	if !had && st == nil {
		return func() {}
	}
	if st == nil {
		delete(c.m, runID)
	} else {
		if c.m == nil {
			c.m = map[string]cancelState{}
		}
		c.m[runID] = *st
	}
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if had {
			c.m[runID] = old
		} else {
			delete(c.m, runID)
		}
	}
}

// stateOf is the cancel state an entry (or its damage) stands for.
func stateOf(q *queueEntry, damaged error) *cancelState {
	switch {
	case damaged != nil:
		return &cancelState{damaged: damaged}
	case q != nil && q.CancelAt != 0:
		return &cancelState{req: q.request()}
	}
	return nil
}

// loadCancels fills the mirror from the file's queue entries (at Open).
func (s *Store) loadCancels() error {
	return withFaultsAsPanics(func() error {
		return s.db.View(func(tx *bolt.Tx) error {
			queue := tx.Bucket(queueBucket)
			if queue == nil {
				return nil
			}
			return queue.ForEach(func(k, v []byte) error {
				q, err := decodeQueued(k, v)
				if st := stateOf(&q, err); st != nil {
					s.cancels.put(string(k), st)
				}
				return nil
			})
		})
	})
}
