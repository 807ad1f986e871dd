package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/polyloop/polyloop/seams"
)

// maxGroup bounds the appends one transaction carries.
const maxGroup = 256

// pending is an append statement waiting for its group. Its result
// fields are written by the leader that sent it before done is closed.
type pending struct {
	runID  string
	sql    string
	args   []any
	events int // the events it appends

	rows   int64                // rows the statement affected (cont: the events it inserted)
	cancel *seams.CancelRequest // cont: the run's cancel request, as its row holds it after the append
	err    error
	done   chan struct{}
	lead   chan struct{} // closed when its appender is made the leader while it waits
}

// grouper queues append statements for their leader: one group in
// flight at a time. An appender that finds no leader at work becomes it:
// it takes what is queued as a group and sends it in one transaction (one
// round trip, one commit, one WAL flush), again until its own statement
// was sent; then it hands the lead to the first appender still waiting,
// or gives it up when none is. So a lone run's append is sent by its own
// goroutine, and what is queued while a group is in flight goes together
// in the next. A group holds at most one statement per run (a run's
// second append waits for the next group), in the order queued.
type grouper struct {
	mu     sync.Mutex
	queue  []*pending // never holds the leader's own statement once it took its first group
	leader bool       // an appender is leading
	closed bool
	idle   *sync.Cond // signalled when the lead is given up
}

func newGrouper() *grouper {
	g := &grouper{}
	g.idle = sync.NewCond(&g.mu)
	return g
}

// take takes a group from the queue.
func (g *grouper) take() []*pending {
	g.mu.Lock()
	defer g.mu.Unlock()
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
	return group
}

// handOff ends the leader's turn: the first waiting appender leads next,
// or, with none waiting, nobody does.
func (g *grouper) handOff() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.queue) > 0 {
		close(g.queue[0].lead)
		return
	}
	g.leader = false
	g.idle.Broadcast()
}

// close refuses new appends and waits until the leader has sent what was
// queued.
func (g *grouper) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	for g.leader {
		g.idle.Wait()
	}
}

// exec queues one append statement of events events and waits for its
// result: the events it inserted (all or none), and for a continuation the
// run's cancel request as the statement read it back. When ctx ends first, a statement not yet sent is withdrawn
// (nothing written: ctx's error); one already in flight may still
// commit, and the error says so. An appender made the leader leads
// whatever its ctx says: the statements queued behind it depend on it.
func (s *Store) exec(ctx context.Context, runID, sql string, events int, args []any) (int64, *seams.CancelRequest, error) {
	p := &pending{runID: runID, sql: sql, args: args, events: events, done: make(chan struct{}), lead: make(chan struct{})}
	g := s.group
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return 0, nil, errClosed
	}
	g.queue = append(g.queue, p)
	leads := !g.leader
	g.leader = true
	g.mu.Unlock()
	if !leads {
		select {
		case <-p.done:
			return p.rows, p.cancel, p.err
		case <-p.lead:
		case <-ctx.Done():
			g.mu.Lock()
			select {
			case <-p.done: // sent meanwhile: its result is known
				g.mu.Unlock()
				return p.rows, p.cancel, p.err
			case <-p.lead: // made the leader meanwhile: it must lead
			default:
				for i, q := range g.queue {
					if q == p {
						g.queue = append(g.queue[:i], g.queue[i+1:]...)
						g.mu.Unlock()
						return 0, nil, ctx.Err()
					}
				}
				g.mu.Unlock()
				return 0, nil, fmt.Errorf("%w while the append was in flight; it may yet commit", ctx.Err())
			}
			g.mu.Unlock()
		}
	}
	// Leading: its own statement is in the queue until a group takes it,
	// and nobody else takes groups, so every round sends one.
	for {
		select {
		case <-p.done:
			g.handOff()
			return p.rows, p.cancel, p.err
		default:
		}
		s.sendGroup(s.sendCtx, g.take())
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
		if p.sql == s.q.cont {
			p.err = p.scanCont(conn.QueryRow(ctx, p.sql, p.args...))
			return p.err
		}
		tag, err := conn.Exec(ctx, p.sql, p.args...)
		p.rows, p.err = tag.RowsAffected(), err
		return err
	}
	b := &pgx.Batch{}
	merged, rest := s.mergeConts(b, group)
	for _, p := range rest {
		b.Queue(p.sql, p.args...)
	}
	br := conn.SendBatch(ctx, b)
	var first error
	if len(merged) > 0 {
		first = readMerged(br, merged)
	}
	for _, p := range rest {
		if p.sql == s.q.cont { // alone in its group (mergeConts merges two or more)
			p.err = p.scanCont(br.QueryRow())
		} else {
			tag, err := br.Exec()
			p.rows, p.err = tag.RowsAffected(), err
		}
		if p.err != nil && first == nil {
			first = p.err
		}
	}
	if err := br.Close(); err != nil && first == nil {
		first = err
	}
	if first != nil {
		for _, p := range group {
			p.rows, p.cancel = 0, nil // the transaction did not commit
			if p.err == nil {
				p.err = first
			}
		}
	}
	return first
}

// scanCont reads a continuation's answer (queries.cont): a row when the
// run's row moved on, so every event was inserted, holding the run's
// cancel request; none when its conditions refused it.
func (p *pending) scanCont(row pgx.Row) error {
	var (
		by *string
		at *time.Time
	)
	switch err := row.Scan(&by, &at); {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return err
	}
	p.rows, p.cancel = int64(p.events), cancelRequest(by, at)
	return nil
}

// notSent is an error before a statement was sent (no connection could be
// had): pgconn.SafeToRetry reports it safe to send again.
type notSent struct{ err error }

func (e notSent) Error() string     { return e.err.Error() }
func (e notSent) Unwrap() error     { return e.err }
func (e notSent) SafeToRetry() bool { return true }

// mergeConts queues, as one statement (queries.conts), the continuations
// of group when there are several: one statement for many runs costs the
// server a fraction of as many statements. It returns them and the rest of
// the group, whose statements go as they are.
func (s *Store) mergeConts(b *pgx.Batch, group []*pending) (merged, rest []*pending) {
	for _, p := range group {
		if p.sql == s.q.cont {
			merged = append(merged, p)
		} else {
			rest = append(rest, p)
		}
	}
	if len(merged) < 2 {
		return nil, group
	}
	n := len(merged)
	var (
		runs, statuses, stops, prevStops, owners = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]*string, n)
		steps, prevSteps                         = make([]int, n), make([]int, n)
		counts, prevCounts, crcs, prevCrcs       = make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
		lasts, prevFirsts, prevLasts             = make([]time.Time, n), make([]time.Time, n), make([]time.Time, n)
		lastIDs, prevIDs                         = make([][]byte, n), make([][]byte, n)
		evRuns, evKinds                          []string
		evOrds, evCrcs                           []int64
		evIDs, evVals                            [][]byte
	)
	var term int64
	for i, p := range merged {
		a := p.args // cont's parameters, in order
		runs[i], statuses[i], steps[i], counts[i], stops[i] = a[0].(string), a[5].(string), a[6].(int), int64(a[7].(int)), a[8].(string)
		lasts[i], lastIDs[i], prevIDs[i], crcs[i] = a[9].(time.Time), a[10].([]byte), a[11].([]byte), a[12].(int64)
		prevSteps[i], prevCounts[i], prevStops[i] = a[13].(int), int64(a[14].(int)), a[15].(string)
		prevFirsts[i], prevLasts[i], prevCrcs[i] = a[16].(time.Time), a[17].(time.Time), a[18].(int64)
		owners[i], term = a[19].(*string), a[20].(int64)
		ids, kinds, vals, sums := a[1].([][]byte), a[2].([]string), a[3].([][]byte), a[4].([]int64)
		for j := range ids {
			evRuns, evOrds = append(evRuns, runs[i]), append(evOrds, int64(j+1))
			evIDs, evKinds, evVals, evCrcs = append(evIDs, ids[j]), append(evKinds, kinds[j]), append(evVals, vals[j]), append(evCrcs, sums[j])
		}
	}
	b.Queue(s.q.conts, runs, statuses, steps, counts, stops, lasts, lastIDs, crcs,
		prevIDs, prevSteps, prevCounts, prevStops, prevFirsts, prevLasts, prevCrcs, owners, term,
		evRuns, evOrds, evIDs, evKinds, evVals, evCrcs)
	return merged, rest
}

// readMerged reads the merged statement's answer: each run whose row
// moved on, so got every event (the others' conditions refused them), and
// its cancel request.
func readMerged(br pgx.BatchResults, merged []*pending) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	moved := make(map[string]*seams.CancelRequest, len(merged))
	for rows.Next() {
		var (
			run string
			by  *string
			at  *time.Time
		)
		if err := rows.Scan(&run, &by, &at); err != nil {
			rows.Close()
			return err
		}
		moved[run] = cancelRequest(by, at)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, p := range merged {
		p.rows, p.cancel, p.err = 0, nil, nil
		if c, ok := moved[p.runID]; ok {
			p.rows, p.cancel = int64(p.events), c
		}
	}
	return nil
}
