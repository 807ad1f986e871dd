package kv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/vmihailenco/msgpack/v5"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

var _ seams.RunStore = (*Store)(nil)

// Errors returned by the store, in addition to the seams contract errors.
var (
	// ErrLocked: another process (or another Open in this one) holds the file.
	ErrLocked = errors.New("kv: store file is locked by another process")
	// ErrCorrupt: the file or a stream in it is damaged.
	ErrCorrupt = errors.New("kv: store is corrupt")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("kv: store is closed")
	// ErrReadOnly: the store was opened read-only.
	ErrReadOnly = errors.New("kv: store is read-only")
)

var (
	runsBucket  = []byte("runs")
	indexBucket = []byte("index")
)

// DefaultLockTimeout bounds the wait for a file held by another process.
const DefaultLockTimeout = time.Second

// Options configure Open. The zero value is a durable read-write store.
type Options struct {
	// ReadOnly opens the file for inspection: no writes, a shared lock, and
	// the file must exist.
	ReadOnly bool
	// LockTimeout bounds the wait for the file lock; zero means
	// DefaultLockTimeout.
	LockTimeout time.Duration
	// NoSync skips fsync. Data may be lost on a machine crash; for
	// benchmarks that measure CPU only.
	NoSync bool
	// MaxGroup caps how many appends one transaction serves; zero means 1024.
	MaxGroup int
}

// Store is a bbolt-backed seams.RunStore, safe for concurrent use.
type Store struct {
	seams.RunLocks // one driver per run in this process; the file lock keeps other processes out

	db       *bolt.DB
	path     string
	readOnly bool
	maxGroup int
	ids      events.IDSource

	// Group commit, leader-based: appenders queue under mu; one of them is
	// the leader and commits everything queued in one transaction, in its
	// own goroutine. A lone append finds no leader and commits at once, with
	// no hand-off to another goroutine.
	mu      sync.Mutex
	queue   []*appendRequest
	leading bool
	closed  bool
	idle    *sync.Cond // signalled when leadership ends (Close waits on it)

	txCount atomic.Uint64 // durable transactions committed, for tests and benchmarks
}

type appendRequest struct {
	runID string
	after ulid.ULID
	evs   []events.Event
	vals  [][]byte
	envs  []events.Envelope
	err   error
	// wake is closed when the request was committed (or failed), or when
	// its appender was made the leader (lead is then true).
	wake  chan struct{}
	lead  bool
	taken bool // in a group being committed: it can no longer be withdrawn
}

// Open opens or creates the store file at path with mode 0600.
func Open(path string, o Options) (*Store, error) {
	timeout := o.LockTimeout
	if timeout <= 0 {
		timeout = DefaultLockTimeout
	}
	if o.ReadOnly {
		fi, err := os.Stat(path)
		if err != nil {
			return nil, fmt.Errorf("kv: open %s read-only: %w", path, err)
		}
		if fi.Size() == 0 {
			return nil, fmt.Errorf("%w: %s is empty, not a store", ErrCorrupt, path)
		}
	}
	// bbolt reads pages while opening; on a truncated file that faults. The
	// file is captured so a fault does not leave its lock behind.
	var file *os.File
	openFile := func(name string, flag int, perm os.FileMode) (*os.File, error) {
		f, err := os.OpenFile(name, flag, perm)
		file = f
		return f, err
	}
	var db *bolt.DB
	err := withFaultsAsPanics(func() (err error) {
		db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: timeout, ReadOnly: o.ReadOnly, NoSync: o.NoSync, OpenFile: openFile,
			NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
		return err
	})
	if err != nil && db == nil && file != nil && errors.Is(err, ErrCorrupt) {
		file.Close()
	}
	if err != nil {
		switch {
		case errors.Is(err, bolterrors.ErrTimeout):
			return nil, fmt.Errorf("%w: %s (waited %s)", ErrLocked, path, timeout)
		case errors.Is(err, ErrCorrupt):
			return nil, err
		case errors.As(err, new(*os.PathError)), errors.As(err, new(*os.SyscallError)):
			return nil, fmt.Errorf("kv: open %s: %w", path, err)
		}
		// bbolt's remaining open errors (invalid, checksum, version
		// mismatch, file size too small...) all mean a damaged file.
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	s := &Store{db: db, path: path, readOnly: o.ReadOnly, maxGroup: o.MaxGroup}
	if s.maxGroup <= 0 {
		s.maxGroup = 1024
	}
	if err := s.prepare(); err != nil {
		withFaultsAsPanics(db.Close)
		return nil, err
	}
	s.idle = sync.NewCond(&s.mu)
	return s, nil
}

// prepare checks that the file is whole and its top-level buckets are
// readable, then (read-write) creates the buckets of a new store.
func (s *Store) prepare() error {
	fi, err := os.Stat(s.path)
	if err != nil {
		return fmt.Errorf("kv: open %s: %w", s.path, err)
	}
	err = withFaultsAsPanics(func() error {
		return s.db.View(func(tx *bolt.Tx) error {
			if tx.Size() > fi.Size() {
				return fmt.Errorf("%w: %s is truncated: %d bytes, its pages need %d", ErrCorrupt, s.path, fi.Size(), tx.Size())
			}
			runs, index := tx.Bucket(runsBucket), tx.Bucket(indexBucket)
			if (runs == nil) != (index == nil) {
				return fmt.Errorf("%w: %s: one of the runs and index buckets is missing", ErrCorrupt, s.path)
			}
			if index != nil {
				return index.ForEach(func(k, v []byte) error { return nil })
			}
			return nil
		})
	})
	if err != nil || s.readOnly {
		return err
	}
	return withFaultsAsPanics(func() error {
		return s.db.Update(func(tx *bolt.Tx) error {
			for _, name := range [][]byte{runsBucket, indexBucket} {
				if _, err := tx.CreateBucketIfNotExists(name); err != nil {
					return fmt.Errorf("%w: %s: bucket %s: %v", ErrCorrupt, s.path, name, err)
				}
			}
			return nil
		})
	})
}

// guard turns a panic inside bbolt (a damaged page, or a fault on a truncated
// mapping) into ErrCorrupt.
func guard(err *error, op string) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("%w: %s: %v", ErrCorrupt, op, r)
	}
}

// withFaultsAsPanics runs f with memory faults turned into recoverable
// panics on this goroutine, so a truncated file cannot crash the process.
func withFaultsAsPanics(f func() error) (err error) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer guard(&err, "read")
	return f()
}

// Path is the file the store was opened on.
func (s *Store) Path() string { return s.path }

// Parameters implements seams.RunStore: the codec's schema version and the
// store kind. Never the path.
func (s *Store) Parameters() map[string]string {
	return map[string]string{"kind": "bbolt", "schema_version": events.CurrentSchemaVersion}
}

// Append implements seams.RunStore. If ctx ends before the append was
// taken into a transaction, nothing is written and ctx's error returned;
// once taken, Append waits for the commit (a bounded disk write). The tail
// check and the keys' floor read the run's bucket inside the transaction
// that writes, so appends grouped into one transaction see each other.
func (s *Store) Append(ctx context.Context, runID string, after ulid.ULID, evs ...events.Event) ([]events.Envelope, error) {
	if s.readOnly {
		return nil, ErrReadOnly
	}
	if len(evs) == 0 {
		return nil, errors.New("kv: append: no events")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	req := &appendRequest{runID: runID, after: after, evs: evs, vals: make([][]byte, len(evs)), wake: make(chan struct{})}
	for i, ev := range evs {
		b, err := events.Marshal(ev)
		if err != nil {
			return nil, err
		}
		req.vals[i] = b
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	s.queue = append(s.queue, req)
	if !s.leading {
		s.leading = true
		s.lead()
		return req.envs, req.err
	}
	s.mu.Unlock()

	select {
	case <-req.wake:
	case <-ctx.Done():
		s.mu.Lock()
		if !req.taken && !req.lead {
			s.withdraw(req)
			s.mu.Unlock()
			return nil, ctx.Err()
		}
		s.mu.Unlock()
		<-req.wake
	}
	if req.lead {
		s.mu.Lock()
		s.lead()
	}
	return req.envs, req.err
}

// withdraw removes a request not yet taken into a group. Called with mu held.
func (s *Store) withdraw(req *appendRequest) {
	for i, r := range s.queue {
		if r == req {
			s.queue = append(s.queue[:i], s.queue[i+1:]...)
			return
		}
	}
}

// lead commits one group: every request queued, up to MaxGroup. The
// leader's own request is always in it, being either alone in the queue (a
// new leader) or at its head (a promoted one). Then it hands leadership to
// the oldest waiting appender, if any. Called with mu held and leading set;
// returns with mu released.
func (s *Store) lead() {
	n := min(len(s.queue), s.maxGroup)
	group := s.queue[:n:n]
	s.queue = s.queue[n:]
	for _, r := range group {
		r.taken = true
	}
	s.mu.Unlock()
	s.commit(group)
	s.mu.Lock()
	if len(s.queue) > 0 {
		next := s.queue[0]
		next.lead = true
		close(next.wake) // it commits what is queued, in its own goroutine
	} else {
		s.leading = false
		s.idle.Broadcast()
	}
	s.mu.Unlock()
}

func (s *Store) commit(group []*appendRequest) {
	err := withFaultsAsPanics(func() (err error) {
		return s.db.Update(func(tx *bolt.Tx) error {
			runs, index := tx.Bucket(runsBucket), tx.Bucket(indexBucket)
			if runs == nil || index == nil {
				return fmt.Errorf("%w: %s: runs or index bucket missing", ErrCorrupt, s.path)
			}
			for _, r := range group {
				r.err = s.apply(runs, index, r)
				var w *writeError
				if errors.As(r.err, &w) {
					return r.err // part of r may be written: the whole group rolls back
				}
			}
			return nil
		})
	})
	if err == nil {
		s.txCount.Add(1)
	}
	s.mu.Lock()
	for _, r := range group {
		if err != nil && r.err == nil {
			r.err, r.envs = err, nil
		}
		if r.lead {
			r.lead = false // the committing leader's own request: its wake is spent
		} else {
			close(r.wake)
		}
	}
	s.mu.Unlock()
}

// apply writes one request into the open transaction, or refuses it having
// written nothing.
func (s *Store) apply(runs, index *bolt.Bucket, r *appendRequest) error {
	key := []byte(r.runID)
	var info RunInfo
	started := false
	if v := index.Get(key); v != nil {
		if err := msgpack.Unmarshal(v, &info); err != nil {
			return fmt.Errorf("%w: index entry of run %q: %v", ErrCorrupt, r.runID, err)
		}
		started = true
	}
	b := runs.Bucket(key)
	var tail ulid.ULID
	if b != nil {
		if k, _ := b.Cursor().Last(); k != nil {
			if len(k) != len(tail) {
				return fmt.Errorf("%w: run %q: last key %x is not a ULID", ErrCorrupt, r.runID, k)
			}
			tail = ulid.ULID(k)
		}
	}
	if started != (tail != ulid.ULID{}) {
		return fmt.Errorf("%w: run %q: its index entry and its stream disagree on whether it exists", ErrCorrupt, r.runID)
	}
	if err := seams.CheckAppend(r.runID, tail, info.Status == StatusFinished, r.after, r.evs); err != nil {
		return err
	}
	if len(key) > bolt.MaxKeySize {
		return fmt.Errorf("kv: run id is %d bytes, longer than bbolt's %d-byte key limit", len(key), bolt.MaxKeySize)
	}
	for i, v := range r.vals {
		if len(v) > bolt.MaxValueSize {
			return fmt.Errorf("kv: event %d (%s) of run %q encodes to %d bytes, more than bbolt's %d-byte value limit",
				i, r.evs[i].Kind(), r.runID, len(v), bolt.MaxValueSize)
		}
	}
	// Past this point nothing is refused: a failure is bbolt's, and fails
	// the whole transaction (writeError), since part of r may be written.
	if b == nil {
		var err error
		if b, err = runs.CreateBucket(key); err != nil {
			return &writeError{fmt.Errorf("kv: bucket for run %q: %w", r.runID, err)}
		}
	}
	if !started {
		info = RunInfo{RunID: r.runID, Status: StatusRunning}
	}
	now := time.Now()
	envs := make([]events.Envelope, len(r.evs))
	for i, ev := range r.evs {
		tail = s.ids.NextAfter(now, tail)
		if err := b.Put(tail[:], r.vals[i]); err != nil {
			return &writeError{fmt.Errorf("kv: put event of run %q: %w", r.runID, err)}
		}
		envs[i] = events.Envelope{ID: tail, Kind: ev.Kind(), SchemaVersion: events.CurrentSchemaVersion, Event: ev}
		info.observe(envs[i])
	}
	v, err := msgpack.Marshal(&info)
	if err != nil {
		return &writeError{fmt.Errorf("kv: index entry of run %q: %w", r.runID, err)}
	}
	if err := index.Put(key, v); err != nil {
		return &writeError{fmt.Errorf("kv: index entry of run %q: %w", r.runID, err)}
	}
	r.envs = envs
	return nil
}

// writeError is a failure after an append began writing: the transaction
// holding it must roll back, or part of the append would be committed.
type writeError struct{ err error }

func (e *writeError) Error() string { return e.err.Error() }
func (e *writeError) Unwrap() error { return e.err }

// Load implements seams.RunStore. A value that does not decode makes Load
// fail with an error wrapping every *events.DecodeError of the stream.
func (s *Store) Load(ctx context.Context, runID string) ([]events.Envelope, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	var out []events.Envelope
	err := withFaultsAsPanics(func() error {
		return s.db.View(func(tx *bolt.Tx) error {
			runs := tx.Bucket(runsBucket)
			if runs == nil {
				return nil // an empty read-only store
			}
			b := runs.Bucket([]byte(runID))
			if b == nil {
				return nil
			}
			var bad []error
			c := b.Cursor()
			for k, v := c.First(); k != nil; k, v = c.Next() {
				if len(k) != len(ulid.ULID{}) {
					bad = append(bad, fmt.Errorf("%w: run %q: key %x is not a ULID", ErrCorrupt, runID, k))
					continue
				}
				env, err := events.Unmarshal(ulid.ULID(k), v) // decoding copies what it keeps
				if err != nil {
					bad = append(bad, err)
					continue
				}
				out = append(out, env)
			}
			return errors.Join(bad...)
		})
	})
	if err != nil {
		return nil, fmt.Errorf("kv: load run %q: %w", runID, err)
	}
	return out, nil
}

// Runs lists every run in the index, ordered by run id.
func (s *Store) Runs(ctx context.Context) ([]RunInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	var out []RunInfo
	err := withFaultsAsPanics(func() error {
		return s.db.View(func(tx *bolt.Tx) error {
			index := tx.Bucket(indexBucket)
			if index == nil {
				return nil
			}
			return index.ForEach(func(k, v []byte) error {
				var info RunInfo
				if err := msgpack.Unmarshal(v, &info); err != nil {
					return fmt.Errorf("%w: index entry of run %q: %v", ErrCorrupt, k, err)
				}
				out = append(out, info)
				return nil
			})
		})
	})
	if err != nil {
		return nil, fmt.Errorf("kv: list runs: %w", err)
	}
	return out, nil
}

func (s *Store) checkOpen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	return nil
}

// Transactions is the number of write transactions committed so far. Tests
// and benchmarks use it to count durable writes per step.
func (s *Store) Transactions() uint64 { return s.txCount.Load() }

// Close waits for the appends already queued to be committed and closes
// the file. Later calls return nil; later appends fail with ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for s.leading {
		s.idle.Wait()
	}
	s.mu.Unlock()
	return withFaultsAsPanics(s.db.Close)
}
