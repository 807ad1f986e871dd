package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// maxGroup bounds the appends one transaction carries.
const maxGroup = 256

// pending is an append statement waiting for its group. Its result
// fields are written by the sender before done is closed.
type pending struct {
	runID string
	sql   string
	args  []any

	rows int64 // rows the statement affected
	err  error
	done chan struct{}
}

// grouper queues append statements and hands them to the senders in
// groups: everything queued while the senders' statements were in flight
// goes in the next transaction (one round trip, one commit, one WAL
// flush), at most one statement per run in a group (a run's second append
// waits for the next), in the order queued.
type grouper struct {
	mu     sync.Mutex
	ready  *sync.Cond // signalled when queue grows or closed is set
	queue  []*pending
	closed bool
}

func newGrouper() *grouper {
	g := &grouper{}
	g.ready = sync.NewCond(&g.mu)
	return g
}

// add queues p, or fails when the store is closing.
func (g *grouper) add(p *pending) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return errClosed
	}
	g.queue = append(g.queue, p)
	g.ready.Signal()
	return nil
}

// withdraw takes p out of the queue if no sender took it yet: then it was
// never sent.
func (g *grouper) withdraw(p *pending) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, q := range g.queue {
		if q == p {
			g.queue = append(g.queue[:i], g.queue[i+1:]...)
			return true
		}
	}
	return false
}

// next waits for appends and takes a group of them: nil once closed and
// drained.
func (g *grouper) next() []*pending {
	g.mu.Lock()
	defer g.mu.Unlock()
	for len(g.queue) == 0 && !g.closed {
		g.ready.Wait()
	}
	if len(g.queue) == 0 {
		return nil
	}
	var (
		group []*pending
		rest  = g.queue[:0]
		runs  = make(map[string]bool, len(g.queue))
	)
	for _, p := range g.queue {
		if runs[p.runID] || len(group) == maxGroup {
			rest = append(rest, p)
			continue
		}
		runs[p.runID] = true
		group = append(group, p)
	}
	clear(g.queue[len(rest):])
	g.queue = rest
	if len(rest) > 0 {
		g.ready.Signal() // another sender may take them now
	}
	return group
}

// close wakes every sender; they send what is queued, then stop.
func (g *grouper) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.ready.Broadcast()
}

// exec queues one append statement and waits for its result: the rows it
// affected. When ctx ends first, a statement not yet sent is withdrawn
// (nothing written: ctx's error); one already in flight may still
// commit, and the error says so.
func (s *Store) exec(ctx context.Context, runID, sql string, args []any) (int64, error) {
	p := &pending{runID: runID, sql: sql, args: args, done: make(chan struct{})}
	if err := s.group.add(p); err != nil {
		return 0, err
	}
	select {
	case <-p.done:
		return p.rows, p.err
	case <-ctx.Done():
		if s.group.withdraw(p) {
			return 0, ctx.Err()
		}
		return 0, fmt.Errorf("%w while the append was in flight; it may yet commit", ctx.Err())
	}
}

// send runs groups until the grouper is closed and drained.
func (s *Store) send(ctx context.Context) {
	for {
		group := s.group.next()
		if group == nil {
			return
		}
		s.sendGroup(ctx, group)
	}
}

// sendGroup runs a group's statements in one transaction: one statement
// alone, several as one pgx batch (sent together, ending with one Sync,
// so PostgreSQL runs them in one implicit transaction). A statement the
// server refuses with an error aborts that transaction, committing
// nothing, so then each is sent alone: one append's error is its own.
// Each statement's conditions decide its run alone: an append refused by
// its run's tail or lease affects no rows and fails nothing else.
func (s *Store) sendGroup(ctx context.Context, group []*pending) {
	defer func() {
		for _, p := range group {
			close(p.done)
		}
	}()
	err := s.sendPatiently(ctx, group)
	var pe *pgconn.PgError
	if len(group) > 1 && errors.As(err, &pe) {
		for _, p := range group {
			p.err = s.sendPatiently(ctx, []*pending{p})
		}
		return
	}
	if err != nil {
		for _, p := range group {
			if p.err == nil {
				p.err = err
			}
		}
	}
}

// sendPatiently is sendOnce, again while it fails without the server
// having received anything (pgconn.SafeToRetry: no connection could be
// made, or a pooled one had died idle), for up to the connect timeout
// with a growing pause: a server restarting or failing over is waited
// for, and the appends go through once it is back.
func (s *Store) sendPatiently(ctx context.Context, group []*pending) error {
	deadline := time.Now().Add(s.connectTimeout)
	for pause := 10 * time.Millisecond; ; pause = min(2*pause, 500*time.Millisecond) {
		err := s.sendOnce(ctx, group)
		if err == nil || !pgconn.SafeToRetry(err) || ctx.Err() != nil || time.Now().Add(pause).After(deadline) {
			return err
		}
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return err
		}
	}
}

// sendOnce sends group on one pooled connection and records each
// statement's result. Its error is the first failure (the group's
// transaction then committed nothing, unless the connection was lost while
// the commit's answer was on its way).
func (s *Store) sendOnce(ctx context.Context, group []*pending) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return notSent{err}
	}
	defer conn.Release()
	if len(group) == 1 {
		p := group[0]
		tag, err := conn.Exec(ctx, p.sql, p.args...)
		p.rows, p.err = tag.RowsAffected(), err
		return err
	}
	b := &pgx.Batch{}
	for _, p := range group {
		b.Queue(p.sql, p.args...)
	}
	br := conn.SendBatch(ctx, b)
	var first error
	for _, p := range group {
		tag, err := br.Exec()
		p.rows, p.err = tag.RowsAffected(), err
		if err != nil && first == nil {
			first = err
		}
	}
	if err := br.Close(); err != nil && first == nil {
		first = err
	}
	if first != nil {
		for _, p := range group {
			p.rows = 0 // the transaction did not commit
			if p.err == nil {
				p.err = first
			}
		}
	}
	return first
}

// notSent is an error before a statement was sent (no connection could be
// had): pgconn.SafeToRetry reports it safe to send again.
type notSent struct{ err error }

func (e notSent) Error() string     { return e.err.Error() }
func (e notSent) Unwrap() error     { return e.err }
func (e notSent) SafeToRetry() bool { return true }
