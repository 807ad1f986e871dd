package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/polyloop/polyloop/seams"
)

// runLock is a run reserved by this process: a pooled connection holding a
// session-level advisory lock on the run, which the run's appends use too.
// mu serialises the connection's use (pgx connections are not safe for
// concurrent use) and guards row; conn is nil while the lock is being
// taken.
type runLock struct {
	mu   sync.Mutex
	conn *pgxpool.Conn
	// row is the run's index row as this process's last append wrote it
	// (nil: unknown), so the driver's next append need not read it back.
	row *indexRow
}

// lockKey is the advisory lock's key text: schema and run id, so stores in
// other schemas of one database do not block each other.
func (s *Store) lockKey(runID string) string {
	return fmt.Sprintf("%d:%s:%s", len(s.schema), s.schema, runID)
}

// LockRun implements seams.RunLocker across processes and machines: it
// takes a pooled connection and a session-level advisory lock on the run
// (pg_try_advisory_lock), held until release. A run reserved by this
// process or by any other client of the database fails at once with
// seams.ErrRunLocked. If the worker dies, its connection drops and
// PostgreSQL releases the lock. The run's appends use the same connection,
// so a running run holds one connection: Options.MaxConns bounds how many
// runs a process drives at once, and LockRun waits up to the connect
// timeout for a free connection before failing.
func (s *Store) LockRun(runID string) (func(), error) {
	if s.readOnly {
		return nil, ErrReadOnly
	}
	if err := seams.ValidRunID(runID); err != nil {
		return nil, fmt.Errorf("pgstore: lock: %w", err)
	}
	s.lockMu.Lock()
	if _, held := s.locks[runID]; held {
		s.lockMu.Unlock()
		return nil, fmt.Errorf("run %q: %w in this process", runID, seams.ErrRunLocked)
	}
	l := &runLock{}
	s.locks[runID] = l
	s.lockMu.Unlock()
	forget := func() {
		s.lockMu.Lock()
		delete(s.locks, runID)
		s.lockMu.Unlock()
	}

	ctx, cancel := context.WithTimeout(context.Background(), s.connectTimeout)
	defer cancel()
	var conn *pgxpool.Conn
	got, err := retry(ctx, func() (bool, error) {
		var err error
		if conn, err = s.pool.Acquire(ctx); err != nil {
			return false, &noConnError{err}
		}
		var got bool
		if err = conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtextextended($1, 0))`, s.lockKey(runID)).Scan(&got); err != nil {
			conn.Release() // a dead connection is dropped from the pool
		}
		return got, err
	})
	var nc *noConnError
	if errors.As(err, &nc) {
		forget()
		return nil, fmt.Errorf("pgstore: lock run %q: no connection within %v (a running run holds one; the pool has %d): %w",
			runID, s.connectTimeout, s.pool.Config().MaxConns, nc.err)
	}
	if err != nil {
		forget()
		return nil, fmt.Errorf("pgstore: lock run %q: %w", runID, err)
	}
	if !got {
		conn.Release()
		forget()
		return nil, fmt.Errorf("run %q: %w by another process", runID, seams.ErrRunLocked)
	}
	l.mu.Lock()
	l.conn = conn
	l.mu.Unlock()
	return sync.OnceFunc(func() {
		forget()
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.conn == nil {
			return // the store was closed, and the session with it
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.connectTimeout)
		defer cancel()
		var released bool
		if err := l.conn.QueryRow(ctx, `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, s.lockKey(runID)).Scan(&released); err != nil || !released {
			l.end() // the lock may still be held: end the session, which ends it
			return
		}
		l.conn.Release()
		l.conn = nil
	}), nil
}

// noConnError: the pool gave no connection.
type noConnError struct{ err error }

func (e *noConnError) Error() string { return e.err.Error() }

// end closes the lock's session, which releases its advisory lock. l.mu is
// held.
func (l *runLock) end() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.conn.Hijack().Close(ctx)
	l.conn = nil
}

// endLocks ends the sessions of every run this process holds: Close does,
// so the pool does not wait for runs that are still being driven.
func (s *Store) endLocks() {
	s.lockMu.Lock()
	held := make([]*runLock, 0, len(s.locks))
	for _, l := range s.locks {
		held = append(held, l)
	}
	s.lockMu.Unlock()
	for _, l := range held {
		l.mu.Lock()
		if l.conn != nil {
			l.end()
		}
		l.mu.Unlock()
	}
}

// session runs statements: the pool, or a run's locked connection.
type session interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// sessionFor returns what runID's statements go through, the run's lock
// when this process holds it (nil otherwise; its row is the caller's until
// done), and a function to call when they are done (their rows closed):
// the run's locked connection when this process holds its lock, the pool
// otherwise. A locked run never needs a second connection, so runs holding
// every connection of the pool cannot starve each other.
func (s *Store) sessionFor(runID string) (session, *runLock, func()) {
	s.lockMu.Lock()
	l := s.locks[runID]
	s.lockMu.Unlock()
	if l == nil {
		return s.pool, nil, func() {}
	}
	l.mu.Lock()
	if l.conn == nil {
		l.mu.Unlock()
		return s.pool, nil, func() {}
	}
	return l.conn, l, l.mu.Unlock
}
