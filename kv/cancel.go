package kv

import (
	"context"
	"fmt"
	"sync"

	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/seams"
)

var _ seams.RunCanceller = (*Store)(nil)

// RequestCancel implements seams.RunCanceller. The request goes into the
// run's queue entry (made for it when the run has none: a run without an
// agent gets one that no worker claims), and into this Store's memory,
// in the transaction that writes it. The holder is this Store's Owner when
// a driver of this process holds the run or this Store claimed it and no
// driver has taken it yet (its worker takes it at once and sees the
// request), else "". A damaged queue entry
// is written anew from the run's RunStarted, with this request. by is at
// most 1 KiB.
func (s *Store) RequestCancel(ctx context.Context, runID, by string) (string, error) {
	if err := s.writable(ctx); err != nil {
		return "", err
	}
	if err := seams.ValidRunID(runID); err != nil {
		return "", fmt.Errorf("kv: request cancel: %w", err)
	}
	if len(by) > maxCancelBy {
		return "", fmt.Errorf("kv: request cancel of run %q: the requester's name is %d bytes, more than %d", runID, len(by), maxCancelBy)
	}
	_, err := s.updateQueue(func(tx *bolt.Tx, queue, index *bolt.Bucket, undo *[]func()) error {
		if err := s.unfinished(tx, index, runID); err != nil {
			return err
		}
		q, _ := readQueued(tx, runID) // a damaged entry is written anew
		switch {
		case q != nil && q.CancelAt != 0:
			return errNothing // the first request stays
		case q == nil:
			agent, err := s.startedAgent(tx, runID)
			if err != nil {
				return err
			}
			q = &queueEntry{Agent: agent}
		}
		q.CancelBy, q.CancelAt = by, s.clock().UnixNano()
		*undo = append(*undo, s.cancels.put(runID, stateOf(q, nil)))
		return putQueued(queue, runID, *q)
	})
	if err != nil {
		return "", wrap(fmt.Sprintf("request cancel of run %q", runID), err)
	}
	if s.holds(runID) {
		return s.owner, nil
	}
	return "", nil
}

// CancelRequested implements seams.RunCanceller, from memory for every
// run: this Store holds the file, and mirrors its requests (see cancels).
// A run whose queue entry is damaged is an ErrCorrupt error: whether a
// request was made is unknown.
func (s *Store) CancelRequested(_ context.Context, runID string) (*seams.CancelRequest, error) {
	st, ok := s.cancels.get(runID)
	switch {
	case !ok:
		return nil, nil
	case st.damaged != nil:
		return nil, fmt.Errorf("kv: cancel requested of run %q: %w", runID, st.damaged)
	}
	r := *st.req
	return &r, nil
}

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
