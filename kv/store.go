package kv

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
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

// DefaultPageSize is the page size of the stores Open creates (bbolt's
// default is the OS page, 4 KiB). A step's compressed StepCompleted is a
// few KiB: in 4 KiB pages most of them sit alone in a page, a third of it
// empty; 16 KiB pages hold several (BenchmarkStorageBytes: 8,356 -> 5,800
// bytes per step of 6,144 bytes of payload). Files made before keep theirs.
const DefaultPageSize = 16 << 10

// pageSizeOf is o's page size for a new file.
func pageSizeOf(o Options) int {
	if o.PageSize > 0 {
		return o.PageSize
	}
	return DefaultPageSize
}

// streamFillPercent is how full a stream's pages are filled before they
// split (bbolt's default, 0.5, suits random inserts).
const streamFillPercent = 1.0

// Store format versions, written at creation into the format marker. A
// file keeps its layout until Compact, which writes the current format (it
// moves a format 1 file to the log).
const (
	formatBuckets = "1" // a nested bucket per run (bucketLayout)
	formatLog     = "2" // one log of all events (logLayout): new files
)

// DefaultLockTimeout bounds the wait for a file held by another process.
const DefaultLockTimeout = time.Second

// DefaultCommitDelay is the leader's wait for further appends (see
// Options.CommitDelay): 30 µs, a tenth of what one fsync'd commit costs here.
// Measured with issue 16's step at 64 runs (BENCHMARKS.md): without it the
// runs settle into two cohorts, each commit carrying the half that was not
// in the one before; with it one commit carries most of them, and 64 runs
// take 8–14 % less time per step.
//
// The leader polls while it waits: it yields its processor
// (runtime.Gosched), so the appenders it waits for run, and looks at the
// queue again; with nothing else to run, that keeps a core busy for the
// delay, hence MaxCommitDelay. It waits only after a commit that carried
// more than one append, whoever's: a store with one run appending never
// waits, and one whose other runs have stopped waits once, after the last
// commit they shared.
const DefaultCommitDelay = 30 * time.Microsecond

// MaxCommitDelay bounds Options.CommitDelay: a millisecond, three lone
// commits' worth here. A longer wait would hold the appends already in the
// group, whose contexts no longer apply once taken, longer than a commit
// of their own would, and poll a core all the while. (It bounds each wait;
// as each append that joins starts the wait again, a group under steady
// arrivals is held for up to one delay per append in it.)
const MaxCommitDelay = time.Millisecond

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
	// CommitDelay is how long the committing leader, having applied every
	// append queued, waits for one more to join its transaction before it
	// commits, when the commit before carried more than one append: the
	// runs that commit released are about to append again, and each that
	// joins rides this commit's fsync instead of waiting for the next. The
	// wait starts again after each append that joins, up to MaxGroup, and
	// ends when the store is closed. Zero means DefaultCommitDelay, or no
	// wait with NoSync (a commit without fsync costs too little to wait
	// for); negative, never wait; more than MaxCommitDelay is refused.
	CommitDelay time.Duration
	// AllowMetaRollback opens a file one of whose two bbolt meta pages is
	// damaged, falling back to the other — which drops whatever the damaged
	// page committed. Without it such a file is refused with ErrCorrupt.
	// For recovery tooling; Store.MetaRollback reports what was accepted.
	AllowMetaRollback bool
	// PageSize is the page size of a store Open creates (a power of two,
	// 1 KiB to 64 KiB; zero: DefaultPageSize). An existing file keeps its own.
	PageSize int

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
}

type appendRequest struct {
	runID string
	after ulid.ULID
	evs   []events.Event
	vals  [][]byte // each value behind logHeader bytes of room for the log's link
	envs  []events.Envelope
	err   error
	// wake is closed when the request was committed (or failed), or when
	// its appender was made the leader (lead is then true).
	wake  chan struct{}
	lead  bool
	taken bool        // in a group being committed: it can no longer be withdrawn
	reply latestReply // the run's latest reply once the events are appended
}

// Open opens the store file at path, or creates it with mode 0600 (read-
// write only). Before bbolt maps an existing file, Open locks it and proves
// it sound (see checkFile): a damaged file yields ErrCorrupt, something
// that is not a store ErrNotAStore, a file held elsewhere ErrLocked — never
// a panic, and a refused Open leaves no lock, mapping or descriptor behind.
func Open(path string, o Options) (*Store, error) {
	if ps := o.PageSize; ps != 0 && (ps < 1<<10 || ps > 64<<10 || ps&(ps-1) != 0) {
		return nil, fmt.Errorf("kv: Options.PageSize %d is not a power of two between 1 KiB and 64 KiB", ps)
	}
	if o.CommitDelay > MaxCommitDelay {
		return nil, fmt.Errorf("kv: Options.CommitDelay %v is more than MaxCommitDelay (%v)", o.CommitDelay, MaxCommitDelay)
	}
	for attempt := 1; ; attempt++ {
		s, err := openOnce(path, o)
		if errors.Is(err, errReplaced) && attempt < 5 {
			continue // Compact swapped a new file in while we waited for the old one's lock
		}
		return s, err
	}
}

// errReplaced: the file at the path is no longer the file opened (Compact
// renamed a new one over it while Open waited for the lock).
var errReplaced = errors.New("kv: the store file was replaced while opening")

func openOnce(path string, o Options) (*Store, error) {
	timeout := o.LockTimeout
	if timeout <= 0 {
		timeout = DefaultLockTimeout
	}
	f, err := openOrCreate(path, o)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("kv: open %s: %w", path, err)
	}
	release, err := claim(identity(path, fi), !o.ReadOnly, path)
	if err != nil {
		f.Close()
		return nil, err
	}
	s, err := open(f, path, o, timeout)
	if err != nil {
		release()
		return nil, err
	}
	s.release = release
	return s, nil
}

// openOrCreate opens path's file, creating a new store first when a
// read-write Open finds none.
func openOrCreate(path string, o Options) (*os.File, error) {
	flag := os.O_RDWR
	if o.ReadOnly {
		flag = os.O_RDONLY
	}
	// Only a regular file can be a store; opening a named pipe or a device
	// could block or touch something else.
	if fi, err := os.Stat(path); err == nil && !fi.Mode().IsRegular() {
		if fi.IsDir() {
			return nil, fmt.Errorf("%w: %s is a directory", ErrNotAStore, path)
		}
		return nil, fmt.Errorf("%w: %s is not a regular file (%s)", ErrNotAStore, path, fi.Mode().Type())
	}
	f, err := os.OpenFile(path, flag, 0)
	if errors.Is(err, fs.ErrNotExist) && !o.ReadOnly {
		if err := create(path, o); err != nil {
			return nil, err
		}
		f, err = os.OpenFile(path, flag, 0)
	}
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is said once
		}
		return nil, fmt.Errorf("kv: open %s: %w", path, err)
	}
	return f, nil
}

// create makes a new store at path atomically: it is built whole in a
// temporary file beside path, then linked in, so path never holds half a
// store (a crash leaves at most a stray temporary file) and a store that
// another process created meanwhile is kept.
func create(path string, o Options) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".polyloop-new-*.db")
	if err != nil {
		return fmt.Errorf("kv: create %s: %w", path, err)
	}
	name := tmp.Name()
	tmp.Close()
	defer os.Remove(name)
	db, err := bolt.Open(name, 0o600, &bolt.Options{NoSync: o.NoSync, NoFreelistSync: true, FreelistType: bolt.FreelistMapType, PageSize: pageSizeOf(o)})
	if err != nil {
		return fmt.Errorf("kv: create %s: %w", path, err)
	}
	version := formatLog
	if o.format == formatBuckets {
		version = formatBuckets
	}
	err = db.Update(func(tx *bolt.Tx) error { return makeFormat(tx, version) })
	if err := errors.Join(err, db.Close()); err != nil {
		return fmt.Errorf("kv: create %s: %w", path, err)
	}
	if err := os.Link(name, path); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("kv: create %s: %w", path, err)
	}
	if dir, err := os.Open(filepath.Dir(path)); err == nil {
		if !o.NoSync {
			dir.Sync() // the new directory entry is durable
		}
		dir.Close()
	}
	return nil
}

// makeFormat creates an empty store of the format version in tx: its
// top-level buckets and the format marker.
func makeFormat(tx *bolt.Tx, version string) error {
	buckets := [][]byte{indexBucket, logBucket, startsBucket}
	if version == formatBuckets {
		buckets = [][]byte{runsBucket, indexBucket}
	}
	for _, name := range buckets {
		if _, err := tx.CreateBucket(name); err != nil {
			return err
		}
	}
	format, err := tx.CreateBucket(formatBucket)
	if err != nil {
		return err
	}
	return format.Put(formatKey, []byte(version))
}

// inProcess counts the stores this process has open, per file: a second
// Open here would wait on this process's own lock, so it is refused at
// once with an error that says so.
var inProcess = struct {
	sync.Mutex
	files map[any]int // readers, or -1 for the writer
}{files: map[any]int{}}

// claim registers an Open of the file id in this process.
func claim(id any, exclusive bool, path string) (func(), error) {
	inProcess.Lock()
	defer inProcess.Unlock()
	n := inProcess.files[id]
	if n < 0 || exclusive && n > 0 {
		return nil, fmt.Errorf("%w by this process: %s is already open in it (close that kv.Store first)", ErrLocked, path)
	}
	if exclusive {
		inProcess.files[id] = -1
	} else {
		inProcess.files[id] = n + 1
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			inProcess.Lock()
			defer inProcess.Unlock()
			if inProcess.files[id]--; exclusive || inProcess.files[id] == 0 {
				delete(inProcess.files, id)
			}
		})
	}, nil
}

// open locks f, proves it sound, and hands it to bbolt. On any error f is
// unlocked and closed, and bbolt (if it got that far) closed.
func open(f *os.File, path string, o Options, timeout time.Duration) (*Store, error) {
	fail := func(err error) (*Store, error) {
		unlockFile(f)
		f.Close()
		return nil, err
	}
	if err := lockFile(f, !o.ReadOnly, timeout); err != nil {
		if errors.Is(err, errLockTimeout) {
			return fail(fmt.Errorf("%w by another process: %s (waited %s)", ErrLocked, path, timeout))
		}
		return fail(fmt.Errorf("kv: open %s: %w", path, err))
	}
	if fi, err := f.Stat(); err == nil {
		if cur, err := os.Stat(path); err == nil && !os.SameFile(fi, cur) {
			return fail(errReplaced)
		}
	}
	size, err := fileSize(f)
	if err != nil {
		return fail(named(path, err))
	}
	var rep fileReport
	err = withFaultsAsPanics(func() (err error) {
		data, unmap := mapFile(f, size)
		defer unmap()
		rep, err = checkFile(f, data, size, o.AllowMetaRollback)
		return err
	})
	if err != nil {
		return fail(named(path, err))
	}
	var db *bolt.DB
	err = withFaultsAsPanics(func() (err error) {
		db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: timeout, ReadOnly: o.ReadOnly, NoSync: o.NoSync,
			OpenFile:       func(string, int, os.FileMode) (*os.File, error) { return f, nil },
			NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
		return err
	})
	switch {
	case errors.Is(err, bolterrors.ErrTimeout):
		// Where kv cannot lock the file itself (lock_other.go), bbolt does.
		return fail(fmt.Errorf("%w by another process: %s (waited %s)", ErrLocked, path, timeout))
	case err != nil:
		// The file check passed, so this is unexpected: report it as damage.
		return fail(fmt.Errorf("%w: %s: bbolt refused it: %v", ErrCorrupt, path, err))
	}
	s := &Store{db: db, file: f, path: path, readOnly: o.ReadOnly, maxGroup: o.MaxGroup, report: rep, clock: time.Now}
	if s.maxGroup <= 0 {
		s.maxGroup = 1024
	}
	switch s.delay = o.CommitDelay; {
	case s.delay == 0 && !o.NoSync:
		s.delay = DefaultCommitDelay
	case s.delay < 0:
		s.delay = 0
	}
	if err := s.prepare(); err != nil {
		withFaultsAsPanics(db.Close)
		return fail(err)
	}
	s.idle = sync.NewCond(&s.mu)
	return s, nil
}

var errLockTimeout = errors.New("lock wait timed out")

// named puts the path into a file-check error: "<kind>: <path>: <detail>".
func named(path string, err error) error {
	var fe *fileError
	if errors.As(err, &fe) {
		return fmt.Errorf("%w: %s: %s", fe.kind, path, fe.detail)
	}
	return fmt.Errorf("kv: open %s: %w", path, err)
}

// MetaRollback describes the damaged meta page an Open with
// Options.AllowMetaRollback accepted, or is empty.
func (s *Store) MetaRollback() string { return s.report.rolledBack }

// prepare reads the format marker, picks the file's layout and checks its
// top-level buckets, and (read-write) marks a store from before the marker
// existed (a format 1 store).
func (s *Store) prepare() error {
	var marked bool
	err := withFaultsAsPanics(func() error {
		return s.db.View(func(tx *bolt.Tx) error {
			var names []string
			if err := tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
				names = append(names, string(name))
				return nil
			}); err != nil {
				return err
			}
			need := [][]byte{runsBucket, indexBucket}
			s.layout = bucketLayout{}
			if format := tx.Bucket(formatBucket); format != nil {
				switch v := format.Get(formatKey); string(v) {
				case formatBuckets:
				case formatLog:
					need, s.layout = [][]byte{indexBucket, logBucket, startsBucket}, logLayout{}
				default:
					return fmt.Errorf("%w: %s: store format %q, this version of kv reads %q and %q", ErrNotAStore, s.path, v, formatBuckets, formatLog)
				}
				marked = true
			} else if tx.Bucket(runsBucket) == nil || tx.Bucket(indexBucket) == nil || len(names) != 2 {
				// A store from before the format marker holds exactly the
				// runs and index buckets; anything else is not ours.
				return fmt.Errorf("%w: %s is a bbolt file without PolyLoop's format marker (top-level buckets: %q)", ErrNotAStore, s.path, names)
			}
			for _, name := range need {
				if tx.Bucket(name) == nil {
					return fmt.Errorf("%w: %s: the %s bucket is missing", ErrCorrupt, s.path, name)
				}
			}
			return nil
		})
	})
	if err != nil || s.readOnly || marked {
		return err
	}
	return withFaultsAsPanics(func() error {
		return s.db.Update(func(tx *bolt.Tx) error {
			format, err := tx.CreateBucketIfNotExists(formatBucket)
			if err != nil {
				return err
			}
			return format.Put(formatKey, []byte(formatBuckets))
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
// once taken, Append waits for the commit: a bounded disk write, after the
// leader's wait for company (Options.CommitDelay) — at most the delay per
// append that joins, so under load up to MaxGroup of them. The tail
// check and the keys' floor read the run's index entry and its last event
// (in format 1, the run's bucket) inside the transaction that writes, so
// appends grouped into one transaction see each other.
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
	if err := seams.ValidRunID(runID); err != nil {
		return nil, fmt.Errorf("kv: append: %w", err)
	}
	req := &appendRequest{runID: runID, after: after, evs: evs, vals: make([][]byte, len(evs)), wake: make(chan struct{})}
	// The run's latest reply as of the tail named, when this process knows
	// it: a StepCompleted repeating it refers to it (events' refs). The
	// tail check puts the events right after that tail, or nowhere.
	//
	// Only in the log: a bucket per run cannot see an event missing from
	// the middle of a stream until it has read it all, and a reference
	// must never resolve to an earlier reply than the one written.
	_, inLog := s.layout.(logLayout)
	if inLog {
		req.reply = s.replies.at(runID, after)
	}
	for i, ev := range evs {
		// Encoded (and compressed) here, by the appender, not by the leader
		// inside the transaction.
		var reply *string
		if inLog && req.reply.known {
			reply = req.reply.content
		}
		b, err := events.AppendMarshalAfter(make([]byte, logHeader, logHeader+256), ev, reply)
		if err != nil {
			return nil, err
		}
		req.vals[i] = b
		req.reply = req.reply.after(ev)
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

// lead commits one group: every request queued, up to MaxGroup, and those
// that join it while it is applied (commit). The leader's own request is
// always in it, being either alone in the queue (a new leader) or at its
// head (a promoted one). Then it hands leadership to the oldest waiting
// appender, if any. Called with mu held and leading set; returns with mu
// released.
func (s *Store) lead() {
	group := s.join(nil)
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

// join takes the requests queued into group, up to maxGroup in all. Called
// with mu held.
func (s *Store) join(group []*appendRequest) []*appendRequest {
	n := min(len(s.queue), s.maxGroup-len(group))
	for _, r := range s.queue[:n] {
		r.taken = true
	}
	group = append(group, s.queue[:n]...)
	s.queue = s.queue[n:]
	return group
}

// more takes into group, once it is applied, the appends queued since it
// was taken. When none has, and the last commit carried more than one, it
// waits for one (Options.CommitDelay): it polls the queue, yielding the
// processor in between, until an append joins, the delay passes or the
// store is closed. It returns group with what joined, or as it was.
func (s *Store) more(group []*appendRequest) []*appendRequest {
	n := len(group)
	s.mu.Lock()
	group = s.join(group)
	wait := len(group) == n && s.delay > 0 && s.lastGroup > 1 && n < s.maxGroup
	if wait {
		s.waits++
	}
	s.mu.Unlock()
	if !wait {
		return group
	}
	for deadline := time.Now().Add(s.delay); len(group) == n && time.Now().Before(deadline); {
		runtime.Gosched()
		s.mu.Lock()
		group = s.join(group)
		closed := s.closed
		s.mu.Unlock()
		if closed {
			break
		}
	}
	return group
}

func (s *Store) commit(group []*appendRequest) {
	err := withFaultsAsPanics(func() (err error) {
		return s.db.Update(func(tx *bolt.Tx) error {
			index := tx.Bucket(indexBucket)
			if index == nil {
				return fmt.Errorf("%w: %s: the index bucket is missing", ErrCorrupt, s.path)
			}
			for i := 0; ; i++ {
				if i == len(group) {
					// Appends queued while the group was applied join it,
					// and those that queue soon after.
					if group = s.more(group); i == len(group) {
						return nil
					}
				}
				r := group[i]
				r.err = s.apply(tx, index, r)
				var w *writeError
				if errors.As(r.err, &w) {
					return r.err // part of r may be written: the whole group rolls back
				}
			}
		})
	})
	s.lastGroup = len(group)
	if err == nil {
		s.txCount.Add(1)
		for _, r := range group {
			if r.err == nil {
				s.replies.set(r.runID, r.envs[len(r.envs)-1].ID, r.reply, r.envs[len(r.envs)-1].Kind == events.KindRunFinished)
			}
		}
	}
	s.mu.Lock()
	for _, r := range group {
		if err != nil {
			// The transaction failed: nothing of the group was written.
			// A request refused by the rules is told so too, since the
			// refusal may have come from the group's own rolled-back writes.
			r.err, r.envs = fmt.Errorf("kv: the transaction failed, nothing was written: %w", err), nil
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
func (s *Store) apply(tx *bolt.Tx, index *bolt.Bucket, r *appendRequest) error {
	if len(r.runID) > bolt.MaxKeySize {
		return fmt.Errorf("kv: run id is %d bytes, longer than bbolt's %d-byte key limit", len(r.runID), bolt.MaxKeySize)
	}
	var (
		info    RunInfo
		started bool
		tail    ulid.ULID
		raw     []byte
	)
	ekey := s.layout.entryKey(tx, r.runID)
	if ekey != nil {
		raw = index.Get(ekey)
	}
	if e, ok := s.written.match(r.runID, raw); ok {
		// The entry is, byte for byte, the one this process wrote with the
		// run's last append, so it decodes to what was written, and that
		// append's events are in the stream it names (this process holds
		// the file's only write lock). Load still verifies all of it.
		info, started, tail = e.info, true, e.info.LastID
	} else {
		var err error
		if info, started, err = readInfo(index, ekey, r.runID); err != nil {
			return err
		}
		if tail, err = s.layout.tail(tx, r.runID, info, started); err != nil {
			return err
		}
	}
	if err := seams.CheckAppend(r.runID, tail, info.Status == StatusFinished, r.after, r.evs); err != nil {
		return err
	}
	for i, v := range r.vals {
		if len(v) > bolt.MaxValueSize {
			return fmt.Errorf("kv: event %d (%s) of run %q encodes to %d bytes, more than bbolt's %d-byte value limit",
				i, r.evs[i].Kind(), r.runID, len(v)-logHeader, bolt.MaxValueSize-logHeader)
		}
	}
	// Past this point nothing is refused: a failure is bbolt's, and fails
	// the whole transaction (writeError), since part of r may be written.
	if !started {
		info = RunInfo{RunID: r.runID, Status: StatusRunning}
	}
	now := s.clock()
	envs := make([]events.Envelope, len(r.evs))
	for i, ev := range r.evs {
		prev := tail
		tail = s.ids.NextAfter(now, tail)
		for s.taken(tx, r.runID, tail) {
			tail = s.ids.NextAfter(now, tail) // another run took it (its clock was ahead)
		}
		if err := events.Seal(r.vals[i][logHeader:], r.runID, tail); err != nil {
			return &writeError{err}
		}
		if err := s.layout.put(tx, r.runID, uint64(info.Events), prev, tail, r.vals[i]); err != nil {
			return &writeError{fmt.Errorf("kv: put event of run %q: %w", r.runID, err)}
		}
		if tail.Compare(s.highest.key) > 0 {
			s.highest.key = tail
		}
		envs[i] = events.Envelope{ID: tail, Kind: ev.Kind(), SchemaVersion: events.CurrentSchemaVersion, Event: ev}
		info.Apply(envs[i])
	}
	if ekey == nil {
		ekey = s.layout.entryKey(tx, r.runID) // the run's first event put it on record
	}
	raw, err := writeInfo(index, ekey, info)
	if err != nil {
		return &writeError{fmt.Errorf("kv: index entry of run %q: %w", r.runID, err)}
	}
	s.written.put(info, raw)
	r.envs = envs
	return nil
}

// replies remembers, for each run this process appended to, the content of
// its latest model reply as of its tail, so a StepCompleted appended right
// after that tail may refer to the reply instead of storing it again. A
// run's entry is replaced on each append it commits and dropped when it
// finishes; it is emptied at maxWrittenEntries.
type replies struct {
	mu sync.Mutex
	m  map[string]replyAt
}

type replyAt struct {
	tail  ulid.ULID
	reply latestReply
}

// latestReply is what a stream holds as its latest reply: known false when
// this process cannot tell; content nil when the latest model call failed
// or there was none.
type latestReply struct {
	known   bool
	content *string
}

// after is the latest reply once ev is appended.
func (l latestReply) after(ev events.Event) latestReply {
	if content, changed := events.ReplyAfter(ev); changed {
		return latestReply{known: true, content: content}
	}
	return l
}

// at is runID's latest reply as of tail: for a run never written (a zero
// tail) there is none; unknown when this process did not append tail.
func (r *replies) at(runID string, tail ulid.ULID) latestReply {
	if tail == (ulid.ULID{}) {
		return latestReply{known: true}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.m[runID]; ok && e.tail == tail {
		return e.reply
	}
	return latestReply{}
}

func (r *replies) set(runID string, tail ulid.ULID, reply latestReply, finished bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if finished {
		delete(r.m, runID)
		return
	}
	if r.m == nil || len(r.m) >= maxWrittenEntries {
		r.m = map[string]replyAt{}
	}
	r.m[runID] = replyAt{tail, reply}
}

// writtenEntries remembers the index entry this process last wrote for each
// run it appends to, so the next append of the run, finding those very
// bytes in the index, need not decode the entry and look its last event up
// again. Entries from a transaction that rolled back are not in the index,
// so they never match; keys are never minted twice, so a match is exact.
// It is used only inside write transactions, which bbolt serializes, and
// bounded: a finished run's entry goes, and it is emptied when it holds
// maxWrittenEntries.
type writtenEntries struct {
	entries map[string]writtenEntry
}

type writtenEntry struct {
	info RunInfo
	raw  []byte
}

// taken reports whether key is already in use where runID's next event
// would be stored. In the log, a key above every key it has held since this
// process first wrote to it is free without a look: keys are put only by
// this process's appends while it holds the file.
func (s *Store) taken(tx *bolt.Tx, runID string, key ulid.ULID) bool {
	if _, inLog := s.layout.(logLayout); inLog {
		if !s.highest.known {
			if k, _ := tx.Bucket(logBucket).Cursor().Last(); k != nil {
				copy(s.highest.key[:], k)
			}
			s.highest.known = true
		}
		if key.Compare(s.highest.key) > 0 {
			return false
		}
	}
	return s.layout.taken(tx, runID, key)
}

const maxWrittenEntries = 1 << 14

// match is runID's remembered entry when raw, the entry in the index, is
// byte for byte the one remembered.
func (w *writtenEntries) match(runID string, raw []byte) (writtenEntry, bool) {
	e, ok := w.entries[runID]
	return e, ok && raw != nil && bytes.Equal(e.raw, raw)
}

func (w *writtenEntries) put(info RunInfo, raw []byte) {
	if info.Status == StatusFinished {
		delete(w.entries, info.RunID)
		return
	}
	if w.entries == nil || len(w.entries) >= maxWrittenEntries {
		w.entries = map[string]writtenEntry{}
	}
	w.entries[info.RunID] = writtenEntry{info, raw}
}

func (w *writtenEntries) forget(runID string) { delete(w.entries, runID) }

// writeError is a failure after an append began writing: the transaction
// holding it must roll back, or part of the append would be committed.
type writeError struct{ err error }

func (e *writeError) Error() string { return e.err.Error() }
func (e *writeError) Unwrap() error { return e.err }

// Load implements seams.RunStore. Every value's checksum is verified, and
// the stream is checked against its index entry (the run exists in both or
// neither; as many events as the entry counts; the last key it names).
// When anything is wrong Load returns the events that did decode together
// with an error wrapping ErrCorrupt and an *events.DamageError listing
// every problem.
func (s *Store) Load(ctx context.Context, runID string) ([]events.Envelope, error) {
	return s.read(ctx, runID, nil)
}

var _ seams.RunScanner = (*Store)(nil)

// Scan implements seams.RunScanner: Load's reading and checks, handing the
// events to fn one at a time and keeping none, inside one read transaction
// (fn should not wait on this store's writers: a writer that must grow the
// file waits for the read to end).
func (s *Store) Scan(ctx context.Context, runID string, fn func(events.Envelope) error) error {
	_, err := s.read(ctx, runID, fn)
	return err
}

// readable is why runID cannot be read now, or nil: ctx ended, an id no
// store keeps, the store closed.
func (s *Store) readable(ctx context.Context, runID string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := seams.ValidRunID(runID); err != nil {
		return fmt.Errorf("kv: load: %w", err)
	}
	return s.checkOpen()
}

// read is Load, or with each set Scan.
func (s *Store) read(ctx context.Context, runID string, each func(events.Envelope) error) ([]events.Envelope, error) {
	if err := s.readable(ctx, runID); err != nil {
		return nil, err
	}
	r := events.StreamReader{RunID: runID, Each: each}
	err := withFaultsAsPanics(func() error {
		return s.db.View(func(tx *bolt.Tx) error {
			index := tx.Bucket(indexBucket)
			if index == nil {
				return fmt.Errorf("%w: %s: the index bucket is missing", ErrCorrupt, s.path)
			}
			info, indexed, err := readInfo(index, s.layout.entryKey(tx, runID), runID)
			if err != nil {
				r.Problem(err)
			}
			n, last, exists := s.layout.read(tx, runID, info, indexed && err == nil, &r)
			switch {
			case !exists && indexed:
				r.Problem(fmt.Errorf("the index lists run %q but its stream is missing", runID))
				return nil
			case !exists:
				return nil // never written
			case !indexed:
				r.Problem(fmt.Errorf("run %q has a stream but no index entry", runID))
			}
			if indexed && err == nil {
				if n != info.Events {
					r.Problem(fmt.Errorf("the stream holds %d events, its index entry counts %d: events are missing or were added", n, info.Events))
				}
				if info.LastID != (ulid.ULID{}) && last != info.LastID {
					r.Problem(fmt.Errorf("the stream's last event is %s, its index entry names %s: the tail is missing or was added", last, info.LastID))
				}
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("kv: load run %q: %w", runID, err)
	}
	out, err := r.Stream()
	switch {
	case r.Stopped():
		return nil, err // fn's own error, as it returned it
	case err != nil:
		return out, fmt.Errorf("kv: load run %q: %w: %w", runID, ErrCorrupt, err)
	}
	return out, nil
}

// Runs lists every run in the index, ordered by run id. An entry that is
// damaged, and a stream whose entry is missing, are listed with
// StatusCorrupt.
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
				return fmt.Errorf("%w: %s: the index bucket is missing", ErrCorrupt, s.path)
			}
			if err := s.layout.entries(tx, func(k, v []byte, runID string) error {
				if runID == "" {
					// No run's first key names it: list it by the run it names, damaged.
					var st storedInfo
					_ = msgpack.Unmarshal(v, &st)
					out = append(out, RunInfo{RunID: cmp.Or(st.RunID, fmt.Sprintf("(index entry %x)", k)), Status: StatusCorrupt})
					return nil
				}
				info, err := decodeInfo(k, v, runID)
				if err != nil {
					info = RunInfo{RunID: runID, Status: StatusCorrupt}
				}
				out = append(out, info)
				return nil
			}); err != nil {
				return err
			}
			// A stream whose index entry is lost is listed too, damaged, once:
			// an entry no first key names is already listed by its run.
			orphans, err := s.layout.orphans(tx, index)
			if len(orphans) > 0 {
				listed := make(map[string]bool, len(out))
				for _, info := range out {
					listed[info.RunID] = true
				}
				for _, id := range orphans {
					if !listed[id] {
						out = append(out, RunInfo{RunID: id, Status: StatusCorrupt})
					}
				}
			}
			slices.SortFunc(out, func(a, b RunInfo) int { return strings.Compare(a.RunID, b.RunID) })
			return err
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

// DataSize is the bytes the store's pages occupy up to its high-water mark
// (free pages inside it included). The file itself is larger: bbolt grows
// it ahead of need, doubling up to 1 GiB.
func (s *Store) DataSize() (int64, error) {
	if err := s.checkOpen(); err != nil {
		return 0, err
	}
	var n int64
	err := withFaultsAsPanics(func() error {
		return s.db.View(func(tx *bolt.Tx) error { n = tx.Size(); return nil })
	})
	return n, err
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
	err := withFaultsAsPanics(s.db.Close)
	unlockFile(s.file) // a no-op once bbolt closed the file
	s.file.Close()
	s.release()
	return err
}
