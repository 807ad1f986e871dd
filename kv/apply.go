package kv

import (
	"bytes"
	"fmt"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

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
	if !started {
		// The run's first append: refused when the run is on record under
		// a damaged copy of its id, so it is not started again.
		if err := s.lost(tx, r.runID); err != nil {
			return fmt.Errorf("kv: append to run %q: %w: %w", r.runID, ErrCorrupt, err)
		}
	}
	for i, v := range r.vals {
		if len(v) > bolt.MaxValueSize {
			return fmt.Errorf("kv: event %d (%s) of run %q encodes to %d bytes, more than bbolt's %d-byte value limit",
				i, r.evs[i].Kind(), r.runID, len(v)-logHeader, bolt.MaxValueSize-logHeader)
		}
	}
	// A run started for an agent joins the queue, and a finished run
	// leaves it, in the transaction of the append (runqueue.go).
	finishing := r.evs[len(r.evs)-1].Kind() == events.KindRunFinished
	var queue *bolt.Bucket
	if !started || finishing {
		if queue = tx.Bucket(queueBucket); queue == nil {
			return fmt.Errorf("%w: %s: the queue bucket is missing", ErrCorrupt, s.path)
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
		var err error
		if tail, err = s.putValue(tx, r.runID, uint64(info.Events), now, tail, r.vals[i], events.Seal); err != nil {
			return &writeError{fmt.Errorf("kv: %w", err)}
		}
		envs[i] = events.Envelope{ID: tail, Kind: ev.Kind(), SchemaVersion: events.CurrentSchemaVersion, Event: ev}
		info.Apply(envs[i])
	}
	if queue != nil {
		if err := s.enqueue(queue, r, started, finishing); err != nil {
			return &writeError{fmt.Errorf("kv: queue entry of run %q: %w", r.runID, err)}
		}
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

// putValue writes v — a stored value, its log header first — as runID's
// event number seq after the one keyed prev, under the next key after prev
// that no other run has taken (another run's clock may have been ahead),
// sealed for runID by seal (events.Seal; events.Reseal for a fork's copy),
// and returns the key. It is how Append and ForkRun write every event.
func (s *Store) putValue(tx *bolt.Tx, runID string, seq uint64, now time.Time, prev ulid.ULID, v []byte,
	seal func([]byte, string, ulid.ULID) error) (ulid.ULID, error) {
	key := s.ids.NextAfter(now, prev)
	for s.taken(tx, runID, key) {
		key = s.ids.NextAfter(now, key)
	}
	if err := seal(v[logHeader:], runID, key); err != nil {
		return key, err
	}
	if err := s.layout.put(tx, runID, seq, prev, key, v); err != nil {
		return key, fmt.Errorf("put event of run %q: %w", runID, err)
	}
	if key.Compare(s.highest.key) > 0 {
		s.highest.key = key
	}
	return key, nil
}

// enqueue keeps the queue beside an append that starts or finishes r's
// run: a run started for an agent gets a new entry, any other start
// removes an entry a run of that id left (a file an older version wrote),
// and a finished run's entry goes. The mirror of cancel requests follows,
// undone with the transaction (r.undo).
func (s *Store) enqueue(queue *bolt.Bucket, r *appendRequest, started, finishing bool) error {
	key := []byte(r.runID)
	if !started && !finishing {
		if st, ok := events.As[events.RunStarted](r.evs[0]); ok && st.Agent != "" {
			r.undo = append(r.undo, s.cancels.put(r.runID, nil))
			return putQueued(queue, r.runID, queueEntry{Agent: st.Agent})
		}
	}
	if queue.Get(key) == nil {
		return nil
	}
	r.undo = append(r.undo, s.cancels.put(r.runID, nil))
	return queue.Delete(key)
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
