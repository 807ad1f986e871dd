package kv

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

var _ seams.RunDescriber = (*Store)(nil)

// queueBucket holds, by run id, the queue entry (queueEntry) of every run
// started for an agent and not finished, and of every run with a cancel
// request not carried out. A read-write Open creates it in a file made
// before it; read-only, a file without it has an empty queue.
var queueBucket = []byte("queue")

// queueEntry is a run's queue entry: the coordination of the workers that
// drive it, not the run's data. Times are Unix nanoseconds, 0 for none.
// CRC is a CRC-32C over the fields and the run id the entry is filed under
// (checksum): an entry that fails it, or does not decode, is damaged.
type queueEntry struct {
	Agent     string `msgpack:"agent"`      // "" for a run no worker claims (one with a cancel request only)
	Owner     string `msgpack:"owner"`      // the Store (Owner) that claimed the run, "" when none holds it
	Failures  int    `msgpack:"failures"`   // drives that failed since the run was submitted or requeued
	LastError string `msgpack:"last_error"` // the last of them
	RetryAt   int64  `msgpack:"retry_at"`   // no claim before
	CancelBy  string `msgpack:"cancel_by"`  // an operator's cancel request: by whom,
	CancelAt  int64  `msgpack:"cancel_at"`  // and when (0: no request)
	CRC       uint32 `msgpack:"crc"`
}

// Bounds of what a queue entry holds.
const (
	// maxQueuedSize bounds a stored entry: a few hundred bytes in practice.
	maxQueuedSize = 64 << 10
	// maxLastError bounds the failure text ReleaseRun keeps: a longer one
	// is cut (at a character boundary) and marked so.
	maxLastError = 4 << 10
	// maxCancelBy bounds the name RequestCancel records.
	maxCancelBy = 1 << 10
)

// checksum is the CRC-32C of q as filed under key: the key and the strings
// length-prefixed, then the numbers as varints, in a fixed order.
func (q *queueEntry) checksum(key []byte) uint32 {
	b := make([]byte, 0, 64+len(key)+len(q.Agent)+len(q.Owner)+len(q.LastError)+len(q.CancelBy))
	b = binary.AppendUvarint(b, uint64(len(key)))
	b = append(b, key...)
	for _, s := range []string{q.Agent, q.Owner, q.LastError, q.CancelBy} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	for _, n := range []int64{int64(q.Failures), q.RetryAt, q.CancelAt} {
		b = binary.AppendVarint(b, n)
	}
	return crc32.Checksum(b, castagnoli)
}

// putQueued stores q, sealed with its checksum, under runID.
func putQueued(queue *bolt.Bucket, runID string, q queueEntry) error {
	key := []byte(runID)
	q.CRC = q.checksum(key)
	v, err := msgpack.Marshal(&q)
	if err != nil {
		return err
	}
	return queue.Put(key, v)
}

// decodeQueued decodes the entry v filed under key: an ErrCorrupt error
// when it is too large, does not decode or fails its checksum.
func decodeQueued(key, v []byte) (queueEntry, error) {
	var q queueEntry
	if len(v) > maxQueuedSize {
		return q, fmt.Errorf("%w: the queue entry of run %q is %d bytes, more than an entry can be", ErrCorrupt, key, len(v))
	}
	if err := events.WellFormed(v); err != nil {
		return q, fmt.Errorf("%w: the queue entry of run %q is not a msgpack value: %v", ErrCorrupt, key, err)
	}
	if err := msgpack.Unmarshal(v, &q); err != nil {
		return queueEntry{}, fmt.Errorf("%w: the queue entry of run %q does not decode: %v", ErrCorrupt, key, err)
	}
	if q.CRC != q.checksum(key) {
		return queueEntry{}, fmt.Errorf("%w: the queue entry of run %q fails its checksum", ErrCorrupt, key)
	}
	return q, nil
}

// readQueued is runID's queue entry: nil without error when it has none
// (or the file has no queue bucket), an ErrCorrupt error when it is
// damaged.
func readQueued(tx *bolt.Tx, runID string) (*queueEntry, error) {
	queue := tx.Bucket(queueBucket)
	if queue == nil {
		return nil, nil
	}
	v := queue.Get([]byte(runID))
	if v == nil {
		return nil, nil
	}
	q, err := decodeQueued([]byte(runID), v)
	if err != nil {
		return nil, err
	}
	return &q, nil
}

// request is the entry's cancel request, nil when it holds none.
func (q *queueEntry) request() *seams.CancelRequest {
	if q.CancelAt == 0 {
		return nil
	}
	return &seams.CancelRequest{By: q.CancelBy, At: time.Unix(0, q.CancelAt)}
}

// Owner is this Store's name in the queue entries of the runs it claims
// and in listings (RunInfo.Owner): host, process id and a random suffix
// drawn at Open, so each Open of a file has its own. An entry naming
// another Owner was left by an Open that has ended.
func (s *Store) Owner() string { return s.owner }

// claims are the runs this Store claimed that no driver has taken yet:
// held for the worker that claimed them, which takes them at once (no
// claim takes them again, RequestCancel names this Store, RequeueRun
// refuses). A driver's LockRun ends the claim: the run is then held as
// any driven run is, and nobody holds it once its driver lets go, so
// another worker (or the claimer's, if another driver took the run
// first) claims it again. ReleaseRun and DeleteRun end it too. The
// file's entry keeps this Store's Owner until ReleaseRun or the run's
// end: an entry naming this Owner whose run is neither claimed nor held
// here is nobody's.
type claims struct {
	mu sync.Mutex
	m  map[string]bool
}

func (c *claims) add(runID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]bool{}
	}
	c.m[runID] = true
}

func (c *claims) drop(runID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, runID)
}

func (c *claims) has(runID string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[runID]
}

// LockRun implements seams.RunLocker: it reserves runID in this process
// (seams.RunLocks; the file lock keeps other processes out), so it
// succeeds for the Store that claimed the run, and ends that claim (see
// claims).
func (s *Store) LockRun(runID string) (func(), error) {
	release, err := s.RunLocks.LockRun(runID)
	if err != nil {
		return nil, err
	}
	s.claims.drop(runID)
	return release, nil
}

// holds reports whether this Store holds runID: a driver of this process
// has it, or this Store claimed it and no driver has taken it yet.
func (s *Store) holds(runID string) bool { return s.Held(runID) || s.claims.has(runID) }

// errNothing ends a queue transaction that has nothing to write: it is
// rolled back, costing no commit.
var errNothing = errors.New("kv: nothing to write")

// updateQueue runs fn in a write transaction with the queue and index
// buckets. wrote reports a commit; fn returning errNothing rolls back
// without an error. undo, filled by fn, is run when the transaction does
// not commit.
func (s *Store) updateQueue(fn func(tx *bolt.Tx, queue, index *bolt.Bucket, undo *[]func()) error) (wrote bool, err error) {
	var undo []func()
	err = withFaultsAsPanics(func() error {
		return s.db.Update(func(tx *bolt.Tx) error {
			index, queue := tx.Bucket(indexBucket), tx.Bucket(queueBucket)
			if index == nil || queue == nil {
				return fmt.Errorf("%w: %s: the index or the queue bucket is missing", ErrCorrupt, s.path)
			}
			return fn(tx, queue, index, &undo)
		})
	})
	if err != nil {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		if errors.Is(err, errNothing) {
			return false, nil
		}
		return false, err
	}
	s.txCount.Add(1)
	return true, nil
}

// writable is why the queue cannot be written now, or nil.
func (s *Store) writable(ctx context.Context) error {
	if s.readOnly {
		return ErrReadOnly
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.checkOpen()
}

// unfinished refuses a run the store does not hold (seams.ErrNoRun), a
// finished one (seams.ErrRunFinished), and one whose index entry is
// damaged or lost (ErrCorrupt).
func (s *Store) unfinished(tx *bolt.Tx, index *bolt.Bucket, runID string) error {
	info, indexed, err := readInfo(index, s.layout.entryKey(tx, runID), runID)
	switch {
	case !indexed && !s.layout.exists(tx, runID):
		if err := s.lost(tx, runID); err != nil {
			return fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		return seams.ErrNoRun
	case err != nil:
		return err
	case !indexed:
		return fmt.Errorf("%w: run %q has a stream but no index entry", ErrCorrupt, runID)
	case info.Status == StatusFinished:
		return seams.ErrRunFinished
	}
	return nil
}

// startedAgent is the agent the run's RunStarted names.
func (s *Store) startedAgent(tx *bolt.Tx, runID string) (string, error) {
	key, sealed, ok := s.layout.first(tx, runID)
	if !ok {
		return "", fmt.Errorf("%w: run %q: its first event cannot be read", ErrCorrupt, runID)
	}
	env, err := events.Unmarshal(runID, key, sealed)
	if err != nil {
		return "", fmt.Errorf("%w: run %q: its first event: %v", ErrCorrupt, runID, err)
	}
	started, ok := events.As[events.RunStarted](env.Event)
	if !ok {
		return "", fmt.Errorf("%w: run %q: its first event is %s, not %s", ErrCorrupt, runID, env.Kind, events.KindRunStarted)
	}
	return started.Agent, nil
}

// Describe implements seams.RunDescriber: the run's index entry (a
// damaged or lost one as StatusCorrupt, as Runs lists it) with its queue
// entry and hold (see coordinate).
func (s *Store) Describe(ctx context.Context, runID string) (RunInfo, error) {
	if err := ctx.Err(); err != nil {
		return RunInfo{}, err
	}
	if err := seams.ValidRunID(runID); err != nil {
		return RunInfo{}, fmt.Errorf("kv: describe: %w", err)
	}
	if err := s.checkOpen(); err != nil {
		return RunInfo{}, err
	}
	var (
		info RunInfo
		q    *queueEntry
		qerr error
	)
	err := withFaultsAsPanics(func() error {
		return s.db.View(func(tx *bolt.Tx) error {
			index := tx.Bucket(indexBucket)
			if index == nil {
				return fmt.Errorf("%w: %s: the index bucket is missing", ErrCorrupt, s.path)
			}
			got, indexed, err := readInfo(index, s.layout.entryKey(tx, runID), runID)
			switch {
			case !indexed && !s.layout.exists(tx, runID) && s.lost(tx, runID) == nil:
				return seams.ErrNoRun
			case err != nil || !indexed:
				info = RunInfo{RunID: runID, Status: StatusCorrupt}
			default:
				info = got
			}
			q, qerr = readQueued(tx, runID)
			return nil
		})
	})
	if err != nil {
		return RunInfo{}, wrap(fmt.Sprintf("describe run %q", runID), err)
	}
	s.coordinate(&info, q, qerr, s.clock())
	return info, nil
}

// coordinate fills info's coordination from the run's queue entry q (nil:
// none; damaged: its damage) and this process's hold, then its liveness at
// now. A driver of this process, or a claim of this Store no driver has
// taken yet, holds the run for as long as this Store is open (no expiry);
// once the driver lets go nobody does. A claim of another Open
// was held by a process that has ended no later than this Store was
// opened: that is its LeaseExpires, so the run reads interrupted. A
// damaged entry leaves the agent and holder unknown (the run reads
// interrupted) and says so in LastError.
func (s *Store) coordinate(info *RunInfo, q *queueEntry, damaged error, now time.Time) {
	switch {
	case damaged != nil:
		info.LastError = fmt.Sprintf("%v (RequeueRun or RequestCancel writes it anew)", damaged)
	case q != nil:
		info.Agent, info.Failures, info.LastError = q.Agent, q.Failures, q.LastError
		if q.RetryAt != 0 {
			info.RetryAt = time.Unix(0, q.RetryAt)
		}
		info.CancelRequested = q.request()
		switch q.Owner {
		case "", s.owner: // this Store's: held only while claimed or driven (below)
		default:
			info.Owner, info.LeaseExpires = q.Owner, s.opened
		}
	}
	if s.holds(info.RunID) {
		info.Owner, info.LeaseExpires = s.owner, time.Time{}
	}
	info.Liveness(now)
}

// queueEntries reads every queue entry (for Runs): by run id, the entry or
// its damage.
func queueEntries(tx *bolt.Tx) (map[string]queueRead, error) {
	queue := tx.Bucket(queueBucket)
	if queue == nil {
		return nil, nil
	}
	out := map[string]queueRead{}
	err := queue.ForEach(func(k, v []byte) error {
		q, err := decodeQueued(k, v)
		out[string(k)] = queueRead{q, err}
		return nil
	})
	return out, err
}

// queueRead is a queue entry as read: the entry, or its damage.
type queueRead struct {
	q   queueEntry
	err error
}

// wrap names the operation in err, nil staying nil.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("kv: %s: %w", op, err)
}
