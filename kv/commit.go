package kv

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// DefaultCommitDelay is the leader's wait for further appends (see
// Options.CommitDelay): a small fraction of what one fsync'd commit costs.
// Without it many runs settle into two cohorts, each commit carrying the
// half that was not in the one before; with it one commit carries most of
// them (BENCHMARKS.md has the measurements).
//
// The leader polls while it waits: it yields its processor
// (runtime.Gosched), so the appenders it waits for run, and looks at the
// queue again; with nothing else to run, that keeps a core busy for the
// delay, hence MaxCommitDelay. When one yield alone outlasts the delay,
// the processors are busy with other goroutines, whose appends queue
// without being waited for, and each further yield would put the leader,
// on whom every appender waits, behind them: that commit waits no more.
// It waits only after a commit that carried more than one append,
// whoever's: a store with one run appending never waits, and one whose
// other runs have stopped waits once, after the last commit they shared.
const DefaultCommitDelay = 30 * time.Microsecond

// MaxCommitDelay bounds Options.CommitDelay: a millisecond, three lone
// commits' worth here. A longer wait would hold the appends already in the
// group, whose contexts no longer apply once taken, longer than a commit
// of their own would, and poll a core all the while. (It bounds each wait;
// as each append that joins starts the wait again, a group under steady
// arrivals is held for up to one delay per append in it.)
const MaxCommitDelay = time.Millisecond

// DefaultMaxGroup is how many appends one transaction serves unless
// Options.MaxGroup says otherwise. The leader applies its group without
// pause: with thousands of runs appending, groups four times larger kept it
// past the Go scheduler's time slice, so it was preempted and queued behind
// the very runs it was to release while the group's first appends waited,
// and the runs it released came back all at once. A group this size is
// applied in a few milliseconds, and the runs one commit releases compute
// their next appends while the leader commits the next group
// (BENCHMARKS.md, "Fleet", has the measurements).
const DefaultMaxGroup = 256

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
	undo  []func()    // restores the mirror of cancel requests if the transaction does not commit
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
	if st, ok := events.As[events.RunStarted](evs[0]); ok && st.Agent != "" {
		// The run's queue entry names the agent, and a claim names it too.
		if err := seams.ValidAgent(st.Agent); err != nil {
			return nil, fmt.Errorf("kv: append to %q: run_started: %w", runID, err)
		}
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
// store is closed. A single yield that outlasts the delay says the
// processors are busy with other goroutines: their appends queue without
// being waited for, and each further yield would put the leader, on whom
// every appender waits, behind them. *busy is then set, and the commit
// waits no more. It returns group with what joined, or as it was.
func (s *Store) more(group []*appendRequest, busy *bool) []*appendRequest {
	n := len(group)
	s.mu.Lock()
	group = s.join(group)
	wait := len(group) == n && s.delay > 0 && s.lastGroup > 1 && n < s.maxGroup && !*busy
	if wait {
		s.waits++
	}
	s.mu.Unlock()
	if !wait {
		return group
	}
	for deadline := time.Now().Add(s.delay); len(group) == n && time.Now().Before(deadline); {
		yielded := time.Now()
		s.yield()
		if time.Since(yielded) >= s.delay {
			*busy = true
		}
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
	busy := false // see more
	err := withFaultsAsPanics(func() (err error) {
		return s.db.Update(func(tx *bolt.Tx) error {
			index := tx.Bucket(indexBucket)
			if index == nil {
				return fmt.Errorf("%w: %s: the index bucket is missing", ErrCorrupt, s.path)
			}
			if _, inLog := s.layout.(logLayout); inLog {
				// Entries filed by first key: a new run's goes to the end.
				index.FillPercent = streamFillPercent
			}
			for i := 0; ; i++ {
				if i == len(group) {
					// Appends queued while the group was applied join it,
					// and those that queue soon after.
					if group = s.more(group, &busy); i == len(group) {
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
	// Without mu: the requests are taken, so no appender withdraws them or
	// is made the leader through them (only the committing leader's own
	// has lead set); each waiter reads its result once its wake is closed.
	// Waking a group of hundreds takes a while, and a leader preempted
	// meanwhile (it may have run its whole time slice) would hold up every
	// appender waiting for mu.
	if err != nil {
		for i := len(group) - 1; i >= 0; i-- {
			for j := len(group[i].undo) - 1; j >= 0; j-- {
				group[i].undo[j]()
			}
		}
	}
	for _, r := range group {
		r.undo = nil
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
}

// writeError is a failure after an append began writing: the transaction
// holding it must roll back, or part of the append would be committed.
type writeError struct{ err error }

func (e *writeError) Error() string { return e.err.Error() }

func (e *writeError) Unwrap() error { return e.err }
