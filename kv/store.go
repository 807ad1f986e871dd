package kv

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

var _ seams.RunStore = (*Store)(nil)

// Errors returned by the store, in addition to the seams contract errors.
var (
	// ErrLocked: the file is held by another process, or already open in
	// this one; the message says which.
	ErrLocked = errors.New("kv: store file is locked")
	// ErrCorrupt: the file or a stream in it is damaged. It matches
	// events.ErrCorruption, as every layer's damage does.
	ErrCorrupt = events.NewCorruption("kv: store is corrupt")
	// ErrNotAStore: the file is not a PolyLoop store — empty, not a bbolt
	// file, or a bbolt file of another application. Nothing is written to it.
	ErrNotAStore = errors.New("kv: not a PolyLoop store")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("kv: store is closed")
	// ErrReadOnly: the store was opened read-only.
	ErrReadOnly = errors.New("kv: store is read-only")
)

var (
	indexBucket = []byte("index")
	// formatBucket marks a file as a PolyLoop store; its formatKey holds
	// the store format version.
	formatBucket = []byte("polyloop")
	formatKey    = []byte("format")
)

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
	// MaxGroup caps how many appends one transaction serves; zero (or
	// less) means DefaultMaxGroup.
	MaxGroup int
	// CommitDelay is how long the committing leader, having applied every
	// append queued, waits for one more to join its transaction before it
	// commits, when the commit before carried more than one append: the
	// runs that commit released are about to append again, and each that
	// joins rides this commit's fsync instead of waiting for the next. The
	// wait starts again after each append that joins, up to MaxGroup; it
	// ends when the store is closed, and for the rest of the commit once
	// one of the leader's yields to the appenders outlasts the delay (the
	// processors are busy: see DefaultCommitDelay). Zero means
	// DefaultCommitDelay, or no wait with NoSync (a commit without fsync
	// costs too little to wait for); negative, never wait; more than
	// MaxCommitDelay is refused.
	CommitDelay time.Duration
	// AllowMetaRollback opens a file one of whose two bbolt meta pages is
	// damaged, falling back to the other — which drops whatever the damaged
	// page committed. Without it such a file is refused with ErrCorrupt.
	// For recovery tooling; Store.MetaRollback reports what was accepted.
	AllowMetaRollback bool
	// PageSize is the page size of a store Open creates (a power of two,
	// 1 KiB to 64 KiB; zero: DefaultPageSize). An existing file keeps its own.
	PageSize int
	// NoServe: a Store opened read-write does not answer other processes'
	// reads over a socket beside its file (SocketPath; see "Readers of a
	// file being written" in the package doc). The zero value serves them.
	NoServe bool

	format string // the format of a store Open creates; tests make format 1 files
}

// Store is a bbolt-backed seams.RunStore, safe for concurrent use.
type Store struct {
	seams.RunLocks // one driver per run in this process; the file lock keeps other processes out

	db       *bolt.DB
	file     *os.File
	path     string
	readOnly bool
	maxGroup int
	delay    time.Duration // Options.CommitDelay, resolved
	// lastGroup is how many appends the last commit carried; used only by
	// the leader (leadership passes under mu).
	lastGroup int
	ids       events.IDSource
	release   func() // ends this process's claim on the file
	report    fileReport
	clock     func() time.Time // time.Now; tests set a clock that is off
	yield     func()           // runtime.Gosched: how a leader waiting for company lets others run; tests slow it
	layout    layout           // the file's, by its format version
	written   writtenEntries   // index entries this process wrote; used only inside write transactions
	// highest is the log's highest key since this process first wrote to
	// it (a rolled-back key may raise it: it only ever errs high); used
	// only inside write transactions.
	highest struct {
		key   ulid.ULID
		known bool
	}
	replies replies // each run's latest reply, as of its tail

	// The queue (runqueue.go): this Open's name in the entries of the runs
	// it claims, when it was opened (the claims of every other Open ended
	// no later), the runs it claimed that no driver has taken yet, and
	// the file's cancel requests, mirrored.
	owner   string
	opened  time.Time
	claims  claims
	cancels cancels

	// Group commit, leader-based: appenders queue under mu; one of them is
	// the leader and commits everything queued in one transaction, in its
	// own goroutine, taking in what queues while it applies the group (and
	// waiting for more, see Options.CommitDelay). A lone append finds no
	// leader and leads itself, with no hand-off to another goroutine.
	mu      sync.Mutex
	queue   []*appendRequest
	leading bool
	closed  bool
	waits   int        // how many times a leader began to wait (more); for tests
	idle    *sync.Cond // signalled when leadership ends (Close waits on it)

	txCount atomic.Uint64 // durable transactions committed, for tests and benchmarks

	// The reader socket (serve.go): the server, or why there is none.
	served   *server
	serveErr error
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
	if s.served != nil {
		s.served.stop() // before the file: reads in progress end with their connections
	}
	err := withFaultsAsPanics(s.db.Close)
	unlockFile(s.file) // a no-op once bbolt closed the file
	s.file.Close()
	s.release()
	return err
}
