package kv

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// How long a Reader keeps the file it opened: it closes it once no read
// used it for readerIdle, and after readerHold even while reads keep
// coming, then lets readerGap pass before it opens the file again, so a
// writer waiting for the file's lock (a second at least, polling it every
// few milliseconds) takes it between two reads.
const (
	readerIdle = 20 * time.Millisecond
	readerHold = 250 * time.Millisecond
	readerGap  = 50 * time.Millisecond
)

// A Reader reads a store file whether or not another process writes it,
// holding the file only while one read lasts: each read opens the file
// read-only (a Store, Options.ReadOnly) and closes it soon after (reads
// that follow each other closely share one opening, for at most a quarter
// of a second); when a process holds the file for writing, reads go to
// its reader socket (a Remote) instead, until it stops answering. So a
// long-lived reader — a viewer, a follower of a run — lets an agent start
// after it, and reads that agent's events live; an agent that starts
// during a read waits for the file up to its Options.LockTimeout (a single
// read of a large run can take longer than DefaultLockTimeout: give such
// an agent a longer LockTimeout). Writes are refused with
// ErrReadOnly. Safe for concurrent use.
//
// A writer that stops answering in the middle of a read (killed) makes
// that read fail with an error wrapping ErrWriterGone; the next read opens
// the file directly, as a read does at once, without a word, after a
// writer that closed its store or was killed between two reads.
type Reader struct {
	path string
	o    Options

	mu       sync.Mutex
	changed  *sync.Cond // the file was closed, or opening ended
	file     *Store     // the file, opened read-only, or nil
	users    int        // reads using file
	opened   time.Time  // when file was opened
	draining bool       // file is held too long: no new read takes it
	opening  bool       // a read is opening the file or dialing
	reopen   time.Time  // not before: the gap a writer may take the file in
	idle     *time.Timer
	remote   *Remote
	closed   bool
}

var (
	_ seams.RunStore     = (*Reader)(nil)
	_ seams.RunReader    = (*Reader)(nil)
	_ seams.RunTailer    = (*Reader)(nil)
	_ seams.RunDescriber = (*Reader)(nil)
	_ seams.RunScanner   = (*Reader)(nil)
)

// OpenReader opens a Reader of the store file at path with o's
// LockTimeout (the wait for a file held by a writer that does not serve
// readers) and AllowMetaRollback; the file is opened read-only, whatever
// o.ReadOnly says. It reads the file once (or dials its writer) before it
// returns, so a file that is missing, damaged or not a store is refused
// here with Open's error; a file held by a writer that does not answer on
// its socket, with ErrLocked and why nothing answers.
func OpenReader(path string, o Options) (*Reader, error) {
	o.ReadOnly = true
	r := &Reader{path: path, o: o}
	r.changed = sync.NewCond(&r.mu)
	_, release, err := r.acquire()
	if err != nil {
		return nil, err
	}
	release()
	return r, nil
}

// Path is the store file.
func (r *Reader) Path() string { return r.path }

// Remote is the writer's reader socket the Reader reads through now, or
// nil when it reads the file.
func (r *Reader) Remote() *Remote {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.remote
}

// Close closes the file or the connection; later reads fail with
// ErrClosed.
func (r *Reader) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	for r.users > 0 || r.opening {
		r.changed.Wait()
	}
	var err error
	if r.file != nil {
		err = r.closeFile()
	}
	if r.remote != nil {
		r.remote.Close()
	}
	return err
}

// reads is what a Reader reads through: a Store or a Remote.
type reads interface {
	Runs(ctx context.Context) ([]RunInfo, error)
	Load(ctx context.Context, runID string) ([]events.Envelope, error)
	LoadAfter(ctx context.Context, runID string, seen int, last ulid.ULID) ([]events.Envelope, error)
	Describe(ctx context.Context, runID string) (RunInfo, error)
	Scan(ctx context.Context, runID string, fn func(events.Envelope) error) error
}

// acquire returns what to read through now, and the release to call when
// the read is done.
func (r *Reader) acquire() (reads, func(), error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		switch {
		case r.closed:
			return nil, nil, ErrClosed
		case r.remote != nil:
			return r.remote, func() {}, nil
		case r.file != nil && !r.draining && time.Since(r.opened) < readerHold:
			r.users++
			if r.idle != nil {
				r.idle.Stop()
			}
			return r.file, r.release, nil
		case r.file != nil && r.users == 0:
			r.closeFile()
			continue
		case r.file != nil:
			r.draining = true // held long enough: close it once the reads using it end
			r.changed.Wait()
			continue
		case r.opening:
			r.changed.Wait()
			continue
		}
		r.opening = true
		wait := time.Until(r.reopen)
		r.mu.Unlock()
		if wait > 0 {
			time.Sleep(wait)
		}
		file, remote, err := r.connect()
		r.mu.Lock()
		r.opening = false
		r.changed.Broadcast()
		if err != nil {
			return nil, nil, err
		}
		if remote != nil {
			r.remote = remote
			continue
		}
		if r.closed {
			file.Close()
			continue
		}
		r.file, r.opened, r.draining = file, time.Now(), false
	}
}

// connect dials the file's writer, or, when none answers, opens the file;
// when that finds the file held for writing, it dials again (a writer
// that was starting). A writer that is closing the store answers so, and
// gives the file up soon: the file is opened, waiting for its lock. When
// the lock wait fails and no socket answers, the writer may have closed
// it meanwhile (a served read kept the file open a moment longer): the
// file is opened once more before a cause is named.
func (r *Reader) connect() (*Store, *Remote, error) {
	closing := false
	for again := false; ; again = true {
		remote, err := Dial(r.path)
		switch {
		case err == nil:
			return nil, remote, nil
		case errors.Is(err, ErrWriterGone):
			closing = true
		case !errors.Is(err, errNoSocket):
			return nil, nil, err
		}
		file, err := Open(r.path, r.o)
		if !errors.Is(err, ErrLocked) {
			return file, nil, err
		}
		remote, derr := Dial(r.path)
		switch {
		case derr == nil:
			return nil, remote, nil
		case errors.Is(derr, ErrWriterGone), closing:
			if again {
				return nil, nil, fmt.Errorf("%w; the process writing it is closing it: try again once it has", err)
			}
		case errors.Is(derr, errNoSocket):
			if again {
				return nil, nil, fmt.Errorf("%w; and it %s", err, unanswered(SocketPath(r.path), derr))
			}
		default:
			return nil, nil, &socketError{fmt.Sprintf("%v; its socket: %s", err, strings.TrimPrefix(derr.Error(), "kv: ")), err, derr}
		}
	}
}

// socketError is a file held for writing (err, ErrLocked) whose socket
// refused a reader (derr); its text has no package prefix inside.
type socketError struct {
	msg       string
	err, derr error
}

func (e *socketError) Error() string   { return e.msg }
func (e *socketError) Unwrap() []error { return []error{e.err, e.derr} }

// unanswered says why nothing answers on sock (derr, Dial's error wrapping
// errNoSocket), after "it" (the writer holding the file).
func unanswered(sock string, derr error) string {
	abs, err := filepath.Abs(sock)
	if err != nil {
		abs = sock
	}
	var de *dialError
	switch {
	case len(abs) > maxSocketPath:
		return fmt.Sprintf("cannot answer readers: its socket's path is too long for a Unix socket (%d bytes, limit %d; move the store to a shorter path)", len(abs), maxSocketPath)
	case errors.As(derr, &de) && errors.Is(de, fs.ErrNotExist):
		return "does not answer readers on its socket (a writer opened with kv.Options.NoServe, or of a version without the socket)"
	case errors.As(derr, &de):
		return fmt.Sprintf("does not answer readers on its socket: %v", osCause(de))
	}
	return fmt.Sprintf("does not answer readers on its socket: %v", derr)
}

// osCause is the innermost error in err: the operating system's reason.
func osCause(err error) error {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err
		}
		err = next
	}
}

// release ends a read of the file: the last one closes it when it was
// held long enough, or arms the idle timer.
func (r *Reader) release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.users--
	if r.users > 0 {
		return
	}
	if r.draining || r.closed || time.Since(r.opened) >= readerHold {
		r.closeFile()
		return
	}
	file := r.file
	if r.idle != nil {
		r.idle.Stop()
	}
	r.idle = time.AfterFunc(readerIdle, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.file == file && r.users == 0 {
			r.closeFile()
		}
	})
}

// closeFile closes the file (mu held, no read using it).
func (r *Reader) closeFile() error {
	err := r.file.Close()
	r.file, r.draining, r.reopen = nil, false, time.Now().Add(readerGap)
	if r.idle != nil {
		r.idle.Stop()
	}
	r.changed.Broadcast()
	return err
}

// do runs one read: through the socket while a writer answers on it
// (forgetting it when it stopped answering, and reading the file at once
// when the request never reached the writer), through the file otherwise.
func (r *Reader) do(read func(reads) error) error {
	for attempt := 0; ; attempt++ {
		via, release, err := r.acquire()
		if err != nil {
			return err
		}
		err = read(via)
		release()
		var gone *goneError
		if remote, ok := via.(*Remote); ok && errors.As(err, &gone) {
			r.mu.Lock()
			if r.remote == remote {
				r.remote = nil
				remote.Close()
			}
			r.mu.Unlock()
			if gone.unsent && attempt == 0 { // reads are idempotent: read the file instead
				continue
			}
		}
		return err
	}
}

// Parameters implements seams.RunStore as Store does.
func (r *Reader) Parameters() map[string]string {
	return map[string]string{"kind": "bbolt", "schema_version": events.CurrentSchemaVersion}
}

// Append implements seams.RunStore: a Reader only reads (ErrReadOnly).
func (r *Reader) Append(context.Context, string, ulid.ULID, ...events.Event) ([]events.Envelope, error) {
	return nil, ErrReadOnly
}

// Runs implements seams.RunReader as Store.Runs does; through a writer's
// socket, with who holds each run as the writer knows it.
func (r *Reader) Runs(ctx context.Context) (infos []RunInfo, err error) {
	err = r.do(func(via reads) error { infos, err = via.Runs(ctx); return err })
	return infos, err
}

// Load implements seams.RunStore as Store.Load does.
func (r *Reader) Load(ctx context.Context, runID string) (stream []events.Envelope, err error) {
	err = r.do(func(via reads) error { stream, err = via.Load(ctx, runID); return err })
	return stream, err
}

// LoadAfter implements seams.RunTailer as Store.LoadAfter does.
func (r *Reader) LoadAfter(ctx context.Context, runID string, seen int, last ulid.ULID) (stream []events.Envelope, err error) {
	err = r.do(func(via reads) error { stream, err = via.LoadAfter(ctx, runID, seen, last); return err })
	return stream, err
}

// Describe implements seams.RunDescriber as Store.Describe does.
func (r *Reader) Describe(ctx context.Context, runID string) (info RunInfo, err error) {
	err = r.do(func(via reads) error { info, err = via.Describe(ctx, runID); return err })
	return info, err
}

// Scan implements seams.RunScanner as Store.Scan does (fn should be quick:
// it runs while the Reader holds the file, or the reply is in hand).
func (r *Reader) Scan(ctx context.Context, runID string, fn func(events.Envelope) error) error {
	return r.do(func(via reads) error { return via.Scan(ctx, runID, fn) })
}
