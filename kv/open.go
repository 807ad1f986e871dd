package kv

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/polyloop/polyloop/seams"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
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

// streamFillPercent is how full a stream's pages, and in the log the
// index's, are filled before they split: new keys come at their end
// (bbolt's default, 0.5, suits random inserts).
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
	buckets := [][]byte{indexBucket, logBucket, startsBucket, queueBucket}
	if version == formatBuckets {
		// As versions before the log made them: a read-write Open adds
		// the queue.
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
	s := &Store{db: db, file: f, path: path, readOnly: o.ReadOnly, maxGroup: o.MaxGroup, report: rep, clock: time.Now, yield: runtime.Gosched,
		owner: seams.NewOwner(""), opened: time.Now()}
	if s.maxGroup <= 0 {
		s.maxGroup = DefaultMaxGroup
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
	if err := s.loadCancels(); err != nil {
		withFaultsAsPanics(db.Close)
		return fail(fmt.Errorf("kv: open %s: read the queue: %w", path, err))
	}
	s.idle = sync.NewCond(&s.mu)
	s.serve(o)
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
// existed (a format 1 store) and adds the queue bucket to a file made
// before it. The queue changes no format version: a file without it reads
// as one with an empty queue.
func (s *Store) prepare() error {
	var marked, queue bool
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
			queue = tx.Bucket(queueBucket) != nil
			return nil
		})
	})
	if err != nil || s.readOnly || marked && queue {
		return err
	}
	return withFaultsAsPanics(func() error {
		return s.db.Update(func(tx *bolt.Tx) error {
			if !marked {
				format, err := tx.CreateBucketIfNotExists(formatBucket)
				if err != nil {
					return err
				}
				if err := format.Put(formatKey, []byte(formatBuckets)); err != nil {
					return err
				}
			}
			_, err := tx.CreateBucketIfNotExists(queueBucket)
			return err
		})
	})
}
