package kv

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/seams"
)

var _ seams.RunQueue = (*Store)(nil)

// ClaimRuns implements seams.RunQueue. It reads the queue bucket — the
// runs started for an agent and not finished, never the index or the log
// of every run — and, in one transaction, writes this Store's Owner into
// the entries of up to max runs, in run id order, that are claimable: of
// one of agents, past their retry time, not claimed by this Store and not
// taken yet (see claims), not held by a driver of this process (it
// reserves each, as LockRun does, while the transaction runs, so a driver
// that starts meanwhile finds it taken and a claimed run is no other
// driver's), whose index entry is sound and says the run has not
// finished. A claim held by another Open was left by a process that has
// ended (the file lock keeps live ones out), and one of this Store whose
// driver let go is nobody's: such runs are claimable at once. A damaged entry is not claimed (see the package
// doc); an entry whose run finished or is gone (a file written by a
// version that kept no queue) is removed. An agent name seams.ValidAgent
// refuses is an error.
func (s *Store) ClaimRuns(ctx context.Context, agents []string, max int) ([]seams.Claim, error) {
	if err := s.writable(ctx); err != nil {
		return nil, err
	}
	if len(agents) == 0 || max < 1 {
		return nil, nil
	}
	wanted := make(map[string]bool, len(agents))
	for _, a := range agents {
		if err := seams.ValidAgent(a); err != nil {
			return nil, fmt.Errorf("kv: claim runs: %w", err)
		}
		wanted[a] = true
	}
	// Most claims find nothing: look first in a read transaction, which
	// costs no commit.
	some := false
	err := withFaultsAsPanics(func() error {
		return s.db.View(func(tx *bolt.Tx) error {
			some = len(s.claimable(tx, wanted, 1, false)) > 0
			return nil
		})
	})
	if err != nil || !some {
		return nil, wrap("claim runs", err)
	}
	var claims []seams.Claim
	var releases []func()
	defer func() {
		for _, release := range releases {
			release()
		}
	}()
	_, err = s.updateQueue(func(tx *bolt.Tx, queue, index *bolt.Bucket, _ *[]func()) error {
		found := s.claimable(tx, wanted, max, true)
		for _, c := range found {
			releases = append(releases, c.release)
		}
		for _, c := range found {
			if c.stale {
				if err := queue.Delete([]byte(c.runID)); err != nil {
					return err
				}
				continue
			}
			c.q.Owner = s.owner
			if err := putQueued(queue, c.runID, c.q); err != nil {
				return err
			}
			claims = append(claims, seams.Claim{RunID: c.runID, Agent: c.q.Agent})
		}
		if len(found) == 0 {
			return errNothing
		}
		return nil
	})
	if err != nil {
		return nil, wrap("claim runs", err)
	}
	for _, c := range claims {
		s.claims.add(c.RunID) // before the reservations are released
	}
	return claims, nil
}

// candidate is a run claimable (or a stale entry to remove) as
// claimable found it, with its reservation when it took one.
type candidate struct {
	runID   string
	q       queueEntry
	stale   bool
	release func()
}

// claimable finds up to max claimable runs of the wanted agents in the
// queue, and the stale entries met on the way. reserve takes each
// candidate's reservation (RunLocks); without it a run a driver holds is
// passed over all the same.
func (s *Store) claimable(tx *bolt.Tx, wanted map[string]bool, max int, reserve bool) []candidate {
	queue, index := tx.Bucket(queueBucket), tx.Bucket(indexBucket)
	if queue == nil || index == nil {
		return nil
	}
	now := s.clock().UnixNano()
	var out []candidate
	claims := 0
	c := queue.Cursor()
	for k, v := c.First(); k != nil && claims < max; k, v = c.Next() {
		q, err := decodeQueued(k, v)
		if err != nil || !wanted[q.Agent] || s.claims.has(string(k)) || q.RetryAt > now {
			continue
		}
		runID := string(k)
		info, indexed, err := readInfo(index, s.layout.entryKey(tx, runID), runID)
		switch {
		case err != nil:
			continue // a damaged index entry: the run is no worker's until someone looks at it
		case !indexed && (s.layout.exists(tx, runID) || s.lost(tx, runID) != nil):
			continue // a stream without an index entry, or under a damaged id: damaged too
		case !indexed || info.Status == StatusFinished:
			out = append(out, candidate{runID: runID, stale: true, release: func() {}})
			continue
		}
		release := func() {}
		if reserve {
			if release, err = s.RunLocks.LockRun(runID); err != nil {
				continue // a driver of this process holds it
			}
			// Asked again with the reservation held: a claim that
			// committed since this one looked notes its runs before it
			// lets them go, so a run reserved here now is known claimed.
			if s.claims.has(runID) {
				release()
				continue
			}
		} else if s.Held(runID) {
			continue
		}
		out = append(out, candidate{runID: runID, q: q, release: release})
		claims++
	}
	return out
}

// ReleaseRun implements seams.RunQueue. No other Store holds a run of this
// file now (the file lock keeps other processes out), so only a driver of
// this process keeps the run as it is: otherwise its claim (this Store's,
// or an ended Open's) is cleared and it is claimable again after retry (at
// once for 0, its retry time cleared); with a failure, the failure count
// goes up and the failure is kept as the last error (cut to 4 KiB). The run is reserved (RunLocks) while its
// entry is written. A run no worker claims — finished, never queued, or
// started without an agent (an entry holding only a cancel request) — is
// left alone; a damaged entry is an ErrCorrupt error (RequeueRun rewrites
// it). A negative retry is an error.
func (s *Store) ReleaseRun(ctx context.Context, runID, failure string, retry time.Duration) error {
	if err := s.writable(ctx); err != nil {
		return err
	}
	if err := seams.ValidRunID(runID); err != nil {
		return fmt.Errorf("kv: release run: %w", err)
	}
	if retry < 0 {
		return fmt.Errorf("kv: release run %q: the retry wait %v is negative (want 0 or more)", runID, retry)
	}
	release, err := s.RunLocks.LockRun(runID)
	if err != nil {
		return nil // a driver of this process holds the run
	}
	defer release()
	s.claims.drop(runID)
	_, err = s.updateQueue(func(tx *bolt.Tx, queue, _ *bolt.Bucket, _ *[]func()) error {
		q, err := readQueued(tx, runID)
		switch {
		case err != nil:
			return err
		case q == nil, q.Agent == "", q.Owner == "" && failure == "" && retry == 0 && q.RetryAt == 0:
			return errNothing
		}
		q.Owner, q.RetryAt = "", 0
		if failure != "" {
			q.Failures++
			q.LastError = clip(failure, maxLastError)
		}
		if failure != "" || retry > 0 {
			q.RetryAt = s.clock().Add(retry).UnixNano()
		}
		return putQueued(queue, runID, *q)
	})
	return wrap(fmt.Sprintf("release run %q", runID), err)
}

// clip is s cut to at most n bytes at a character boundary, marked when
// cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = " … (cut)"
	i := n - len(mark)
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + mark
}

// RequeueRun implements seams.RunQueue: the run's entry keeps its agent
// and cancel request, and loses its claim (an Open's that has ended, or
// this Store's whose driver let go), failure count, last error and retry
// time. It fails with seams.ErrRunLocked naming this Store's Owner when a
// driver of this process holds the run, or this Store claimed it and no
// driver has taken it yet (see claims). A queue entry that is
// missing or damaged is written anew from the run's RunStarted: a cancel
// request a damaged entry held is lost.
func (s *Store) RequeueRun(ctx context.Context, runID string) error {
	if err := s.writable(ctx); err != nil {
		return err
	}
	if err := seams.ValidRunID(runID); err != nil {
		return fmt.Errorf("kv: requeue run: %w", err)
	}
	release, held := s.RunLocks.LockRun(runID)
	if held == nil {
		defer release()
	}
	claimed := s.claims.has(runID) // the reservation keeps a claim from starting or ending meanwhile
	_, err := s.updateQueue(func(tx *bolt.Tx, queue, index *bolt.Bucket, undo *[]func()) error {
		if err := s.unfinished(tx, index, runID); err != nil {
			return err
		}
		q, damaged := readQueued(tx, runID)
		if q == nil {
			agent, err := s.startedAgent(tx, runID)
			if err != nil {
				return err
			}
			q = &queueEntry{Agent: agent}
		}
		switch {
		case q.Agent == "":
			return seams.ErrNotQueued
		case held != nil:
			return fmt.Errorf("%w: a driver of this process (%s) holds it", seams.ErrRunLocked, s.owner)
		case claimed:
			return fmt.Errorf("%w: this Store (%s) claimed it for a worker that has not taken it yet", seams.ErrRunLocked, s.owner)
		}
		fresh := queueEntry{Agent: q.Agent, CancelBy: q.CancelBy, CancelAt: q.CancelAt}
		if damaged != nil {
			*undo = append(*undo, s.cancels.put(runID, nil))
		}
		return putQueued(queue, runID, fresh)
	})
	return wrap(fmt.Sprintf("requeue run %q", runID), err)
}
