package kv

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/events"
)

// A layout is how a file lays its runs' streams out. A file has one, named
// by its format version: format 1 files keep a nested bucket per run
// (bucketLayout), format 2 files one log of all events (logLayout). Both
// keep the index bucket of RunInfo entries, written in the transaction that
// appends.
type layout interface {
	// tail is the run's last key, zero for a run never written; an error
	// (ErrCorrupt) when the stream contradicts the index entry.
	tail(tx *bolt.Tx, runID string, info RunInfo, indexed bool) (ulid.ULID, error)
	// put writes the run's event number seq (from 0) under key, after prev
	// (zero for the run's first event), into an open transaction. v is the
	// sealed value behind logHeader bytes of room; put owns v.
	put(tx *bolt.Tx, runID string, seq uint64, prev, key ulid.ULID, v []byte) error
	// taken reports whether key is in use (keys are unique across a file).
	taken(tx *bolt.Tx, runID string, key ulid.ULID) bool
	// read hands the run's stream to r in order and returns how many
	// values it read and the last key; a stream that is not there reads as
	// none, with exists false.
	read(tx *bolt.Tx, runID string, info RunInfo, indexed bool, r streamSink) (n int, last ulid.ULID, exists bool)
	// values is the run's stream as stored, in order, each event's key and
	// sealed value without decoding it, and what is wrong with it as read
	// finds it; exists as read's.
	values(tx *bolt.Tx, runID string, info RunInfo, indexed bool) (chain []chained, problems []error, exists bool)
	// readAfter hands r the events after the run's first seen (at most
	// info.Events, its sound index entry's count), the seen-th of which is
	// last, reading only those; false when what it finds does not fit (the
	// caller then reads the whole stream).
	readAfter(tx *bolt.Tx, runID string, info RunInfo, seen int, last ulid.ULID, r *events.StreamReader) bool
	// exists reports whether the run has a stream, sound or not.
	exists(tx *bolt.Tx, runID string) bool
	// first is the key and sealed value of the run's first event; ok
	// false when the layout has none on record (or none it can read).
	first(tx *bolt.Tx, runID string) (key ulid.ULID, sealed []byte, ok bool)
	// entryKey is the key the run's index entry is filed under (nil: the
	// run has none on record): its run id in format 1; in the log, its
	// first key, so the entries of the runs being driven — the newest —
	// sit together at the index's end, in leaves filled whole, and a
	// commit serving 64 of them rewrites a leaf or two of the index, not
	// one per run.
	entryKey(tx *bolt.Tx, runID string) []byte
	// entries calls fn with each index entry, its key and the run it is
	// filed for ("" when the layout cannot tell).
	entries(tx *bolt.Tx, fn func(key, v []byte, runID string) error) error
	// orphans lists runs that have a stream but no index entry.
	orphans(tx *bolt.Tx, index *bolt.Bucket) ([]string, error)
	// remove deletes the run's stream.
	remove(tx *bolt.Tx, runID string, info RunInfo, indexed bool) error
	// idBucket names the top-level bucket whose keys are the runs' ids.
	idBucket() []byte
	// firstAt is first for the run filed under idBucket's key k (its
	// value v), read from where a cursor found it (lost.go).
	firstAt(tx *bolt.Tx, k, v []byte) (key ulid.ULID, sealed []byte, ok bool)
}

// Top-level buckets of each layout (beside formatBucket and indexBucket).
var (
	runsBucket   = []byte("runs")   // format 1: a nested bucket per run
	logBucket    = []byte("log")    // format 2: every event, keyed by ULID
	startsBucket = []byte("starts") // format 2: run id -> its first key
)

// bucketLayout is format 1: a nested bucket per run under runsBucket, keys
// the events' ULIDs. A run is one cursor's walk; but a commit serving many
// runs rewrites each run's last leaf and the branch above it, so 64 runs
// grouped write a page chain per run (BenchmarkLayoutFloor).
type bucketLayout struct{}

func (bucketLayout) stream(tx *bolt.Tx, runID string) (*bolt.Bucket, error) {
	runs := tx.Bucket(runsBucket)
	if runs == nil {
		return nil, fmt.Errorf("%w: the runs bucket is missing", ErrCorrupt)
	}
	b := runs.Bucket([]byte(runID))
	if b == nil && runs.Get([]byte(runID)) != nil {
		return nil, fmt.Errorf("%w: run %q: the runs bucket holds a value, not a stream, under its id", ErrCorrupt, runID)
	}
	return b, nil
}

func (l bucketLayout) tail(tx *bolt.Tx, runID string, info RunInfo, indexed bool) (ulid.ULID, error) {
	b, err := l.stream(tx, runID)
	if err != nil {
		return ulid.ULID{}, err
	}
	var tail ulid.ULID
	if b != nil {
		if k, _ := b.Cursor().Last(); k != nil {
			if len(k) != len(tail) {
				return tail, fmt.Errorf("%w: run %q: last key %x is not a ULID", ErrCorrupt, runID, k)
			}
			tail = ulid.ULID(k)
		}
	}
	if indexed != (tail != ulid.ULID{}) || info.LastID != (ulid.ULID{}) && info.LastID != tail {
		return tail, fmt.Errorf("%w: run %q: its index entry and its stream disagree on its last event", ErrCorrupt, runID)
	}
	return tail, nil
}

func (l bucketLayout) put(tx *bolt.Tx, runID string, _ uint64, _, key ulid.ULID, v []byte) error {
	b, err := l.stream(tx, runID)
	if err != nil {
		return err
	}
	if b == nil {
		if b, err = tx.Bucket(runsBucket).CreateBucket([]byte(runID)); err != nil {
			return fmt.Errorf("bucket for run %q: %w", runID, err)
		}
	}
	// A stream is append-only (its keys only grow), so its leaves are never
	// split to make room for a key in the middle: fill them whole instead of
	// bbolt's default half (bbolt reads this per transaction).
	b.FillPercent = streamFillPercent
	return b.Put(key[:], v[logHeader:])
}

func (bucketLayout) taken(*bolt.Tx, string, ulid.ULID) bool { return false } // keys only grow within a bucket

func (l bucketLayout) read(tx *bolt.Tx, runID string, _ RunInfo, _ bool, r streamSink) (n int, last ulid.ULID, exists bool) {
	b, err := l.stream(tx, runID)
	if err != nil {
		r.Problem(err)
		return 0, last, true
	}
	if b == nil {
		return 0, last, false
	}
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		n++
		if len(k) != len(last) {
			r.Problem(fmt.Errorf("key %x is not a ULID", k))
			continue
		}
		last = ulid.ULID(k)
		if r.Value(last, v); r.Stopped() { // decoding copies what it keeps
			break
		}
	}
	return n, last, true
}

func (l bucketLayout) values(tx *bolt.Tx, runID string, _ RunInfo, _ bool) (chain []chained, problems []error, exists bool) {
	b, err := l.stream(tx, runID)
	if err != nil {
		return nil, []error{err}, true
	}
	if b == nil {
		return nil, nil, false
	}
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if len(k) != len(ulid.ULID{}) {
			problems = append(problems, fmt.Errorf("key %x is not a ULID", k))
			continue
		}
		chain = append(chain, chained{ulid.ULID(k), v})
	}
	return chain, problems, true
}

func (bucketLayout) exists(tx *bolt.Tx, runID string) bool {
	return tx.Bucket(runsBucket).Get([]byte(runID)) != nil || tx.Bucket(runsBucket).Bucket([]byte(runID)) != nil
}

func (l bucketLayout) first(tx *bolt.Tx, runID string) (ulid.ULID, []byte, bool) {
	b, err := l.stream(tx, runID)
	if err != nil || b == nil {
		return ulid.ULID{}, nil, false
	}
	k, v := b.Cursor().First()
	if len(k) != len(ulid.ULID{}) {
		return ulid.ULID{}, nil, false
	}
	return ulid.ULID(k), v, true
}

func (bucketLayout) entryKey(_ *bolt.Tx, runID string) []byte { return []byte(runID) }

func (bucketLayout) entries(tx *bolt.Tx, fn func(key, v []byte, runID string) error) error {
	return tx.Bucket(indexBucket).ForEach(func(k, v []byte) error { return fn(k, v, string(k)) })
}

func (bucketLayout) orphans(tx *bolt.Tx, index *bolt.Bucket) ([]string, error) {
	var out []string
	err := tx.Bucket(runsBucket).ForEach(func(k, _ []byte) error {
		if index.Get(k) == nil {
			out = append(out, string(k))
		}
		return nil
	})
	return out, err
}

func (l bucketLayout) remove(tx *bolt.Tx, runID string, _ RunInfo, _ bool) error {
	b, err := l.stream(tx, runID)
	if err != nil || b == nil {
		return err
	}
	return tx.Bucket(runsBucket).DeleteBucket([]byte(runID))
}

// logLayout is format 2: one append-only bucket of every run's events,
// keyed by ULID, each value led by a header naming the run's previous key;
// the run's index entry names its last key and event count, and
// startsBucket its first key. Keys are minted from one clock for the whole
// file, so a commit serving many runs appends to the log's last leaves
// only, instead of a page chain per run (BenchmarkLayoutFloor). A run is read by walking its chain back from the
// last key, one point lookup per event.
type logLayout struct{}

// logHeader is the bytes before a sealed event value in the log: the run's
// previous key (zero for its first event), the event's number in its run
// (from 0), and a CRC-32C over both and the event's own key, so a damaged
// link is seen as damage, never followed, and an index entry naming an
// earlier event of the run as its last is caught before a write forks the
// chain.
const logHeader = 16 + 8 + 4

func linkSum(key, prev ulid.ULID, seq []byte) uint32 {
	sum := crc32.Update(crc32.Checksum(key[:], castagnoli), castagnoli, prev[:])
	return crc32.Update(sum, castagnoli, seq)
}

// link writes the link header into v's first logHeader bytes.
func link(v []byte, key, prev ulid.ULID, seq uint64) {
	copy(v, prev[:])
	binary.BigEndian.PutUint64(v[16:], seq)
	binary.BigEndian.PutUint32(v[24:], linkSum(key, prev, v[16:24]))
}

// splitLog parses a log value into the previous key, the event's number
// and the sealed event.
func splitLog(key ulid.ULID, v []byte) (prev ulid.ULID, seq uint64, sealed []byte, err error) {
	if len(v) < logHeader {
		return prev, 0, nil, fmt.Errorf("log value %s is %d bytes, shorter than its header", key, len(v))
	}
	prev = ulid.ULID(v[:16])
	if binary.BigEndian.Uint32(v[24:logHeader]) != linkSum(key, prev, v[16:24]) {
		return prev, 0, nil, fmt.Errorf("log value %s: its link to the previous event fails its checksum", key)
	}
	return prev, binary.BigEndian.Uint64(v[16:24]), v[logHeader:], nil
}

func (logLayout) buckets(tx *bolt.Tx) (log, starts *bolt.Bucket, err error) {
	log, starts = tx.Bucket(logBucket), tx.Bucket(startsBucket)
	if log == nil || starts == nil {
		return nil, nil, fmt.Errorf("%w: the log or starts bucket is missing", ErrCorrupt)
	}
	return log, starts, nil
}

func (l logLayout) tail(tx *bolt.Tx, runID string, info RunInfo, indexed bool) (ulid.ULID, error) {
	log, starts, err := l.buckets(tx)
	if err != nil {
		return ulid.ULID{}, err
	}
	started := starts.Get([]byte(runID)) != nil
	switch {
	case !indexed && started:
		return ulid.ULID{}, fmt.Errorf("%w: run %q has a stream but no index entry", ErrCorrupt, runID)
	case !indexed:
		return ulid.ULID{}, nil
	}
	disagree := func(why string, a ...any) error {
		return fmt.Errorf("%w: run %q: its index entry and its stream disagree on its last event: %s", ErrCorrupt, runID, fmt.Sprintf(why, a...))
	}
	switch {
	case !started:
		return ulid.ULID{}, disagree("the run has no first event on record")
	case info.LastID == (ulid.ULID{}) || info.Events < 1:
		return ulid.ULID{}, disagree("the entry names no last event")
	}
	v := log.Get(info.LastID[:])
	if v == nil {
		return ulid.ULID{}, disagree("the entry names %s, which is not in the log", info.LastID)
	}
	_, seq, _, err := splitLog(info.LastID, v)
	switch {
	case err != nil:
		return ulid.ULID{}, disagree("%v", err)
	case seq != uint64(info.Events-1):
		return ulid.ULID{}, disagree("the entry names %s, the run's event %d, and counts %d events", info.LastID, seq, info.Events)
	}
	return info.LastID, nil
}

func (l logLayout) put(tx *bolt.Tx, runID string, seq uint64, prev, key ulid.ULID, v []byte) error {
	log, starts, err := l.buckets(tx)
	if err != nil {
		return err
	}
	if prev == (ulid.ULID{}) {
		if err := starts.Put([]byte(runID), key[:]); err != nil {
			return err
		}
	}
	link(v, key, prev, seq)
	// Keys come from one monotonic source, so the log grows at its end:
	// fill its pages whole. (A key minted after a run's tail from a clock
	// that was ahead lands further right; later keys go before it and the
	// leaf splits there as it would anywhere.)
	log.FillPercent = streamFillPercent
	return log.Put(key[:], v)
}

func (logLayout) taken(tx *bolt.Tx, _ string, key ulid.ULID) bool {
	return tx.Bucket(logBucket).Get(key[:]) != nil
}

func (l logLayout) read(tx *bolt.Tx, runID string, info RunInfo, indexed bool, r streamSink) (n int, last ulid.ULID, exists bool) {
	log, starts, err := l.buckets(tx)
	if err != nil {
		r.Problem(err)
		return 0, last, true
	}
	chain, gap, problems, exists := l.chain(log, starts, runID, info, indexed)
	// The problems are reported where they are in the stream, between the
	// events found forward and those found back: a problem makes the
	// reader forget the latest reply, and a reference after a gap must not
	// resolve to a reply from before it.
	for i := 0; i <= len(chain) && !r.Stopped(); i++ {
		if i == gap {
			for _, p := range problems {
				r.Problem(p)
			}
		}
		if i < len(chain) {
			r.Value(chain[i].key, chain[i].sealed) // decoding copies what it keeps
		}
	}
	if len(chain) > 0 {
		last = chain[len(chain)-1].key
	}
	return len(chain), last, exists
}

func (l logLayout) values(tx *bolt.Tx, runID string, info RunInfo, indexed bool) (chain []chained, problems []error, exists bool) {
	log, starts, err := l.buckets(tx)
	if err != nil {
		return nil, []error{err}, true
	}
	chain, _, problems, exists = l.chain(log, starts, runID, info, indexed)
	return chain, problems, exists
}

// chained is one event of a run's chain: its key and sealed value.
type chained struct {
	key    ulid.ULID
	sealed []byte
}

// chain finds the run's events in order and what is wrong with them. It
// walks back from the index entry's last key (indexed: the entry is sound),
// at most as many steps as the entry counts, checking every link; where
// that walk cannot reach the run's first event — a missing or damaged
// event, or no usable entry — it also follows the links forward from the
// first key on record, scanning the log after it, so every event a link
// still reaches is returned, as a bucket per run returns what it holds.
// gap is where in chain the events found forward end and those found back
// begin (0 when none were found forward): where the problems are. exists
// reports whether the run has anything on record.
func (logLayout) chain(log, starts *bolt.Bucket, runID string, info RunInfo, indexed bool) (chain []chained, gap int, problems []error, exists bool) {
	first := starts.Get([]byte(runID))
	if first != nil && len(first) != 16 {
		problems = append(problems, fmt.Errorf("run %q: its first event on record, %x, is not a ULID", runID, first))
		first = nil
	}
	var back []chained // newest first
	reachedStart := false
	if indexed {
		if first == nil {
			problems = append(problems, fmt.Errorf("run %q has no first event on record", runID))
		}
		if info.LastID == (ulid.ULID{}) {
			problems = append(problems, fmt.Errorf("run %q: its index entry names no last event", runID))
		}
		key := info.LastID
		for key != (ulid.ULID{}) && len(back) < info.Events {
			v := log.Get(key[:])
			if v == nil {
				problems = append(problems, fmt.Errorf("event %s of the run's chain is missing: events are missing", key))
				break
			}
			prev, seq, sealed, err := splitLog(key, v)
			if err != nil {
				problems = append(problems, err)
				break
			}
			if want := uint64(info.Events - 1 - len(back)); seq != want {
				if len(back) == 0 {
					problems = append(problems, fmt.Errorf("the index entry names %s, the run's event %d, as its last event; it counts %d events: the tail is missing or was added", key, seq, info.Events))
				} else {
					problems = append(problems, fmt.Errorf("event %s is the run's event %d where event %d belongs: events are missing", key, seq, want))
				}
				break
			}
			if prev != (ulid.ULID{}) && prev.Compare(key) >= 0 || seq == 0 && prev != (ulid.ULID{}) {
				problems = append(problems, fmt.Errorf("event %s (the run's event %d) links back to %s", key, seq, prev))
				break
			}
			back = append(back, chained{key, sealed})
			key = prev
			if key == (ulid.ULID{}) {
				reachedStart = true
				if first != nil && ulid.ULID(first) != back[len(back)-1].key {
					problems = append(problems, fmt.Errorf("the chain starts at %s, the run's first event on record is %s: events are missing", back[len(back)-1].key, ulid.ULID(first)))
				}
			}
		}
	}
	if !reachedStart && first != nil {
		// Forward from the first key to where the walk back stopped.
		stop := ulid.ULID{}
		if len(back) > 0 {
			stop = back[len(back)-1].key
		}
		chain = forward(log, ulid.ULID(first), stop)
	}
	gap = len(chain)
	for i := len(back) - 1; i >= 0; i-- {
		chain = append(chain, back[i])
	}
	return chain, gap, problems, indexed || first != nil
}

// forward follows a run's links from its first event, scanning the log
// after it for the value that links to the last one found, up to (not
// including) stop, or the log's end when stop is zero. Values whose link
// fails its checksum are skipped: nothing links through them.
func forward(log *bolt.Bucket, first, stop ulid.ULID) []chained {
	v := log.Get(first[:])
	if v == nil {
		return nil
	}
	prev, seq, sealed, err := splitLog(first, v)
	if err != nil || seq != 0 || prev != (ulid.ULID{}) {
		return nil
	}
	out := []chained{{first, sealed}}
	c := log.Cursor()
	for k, v := c.Seek(first[:]); k != nil; k, v = c.Next() {
		if len(k) != len(first) {
			continue
		}
		key := ulid.ULID(k)
		if stop != (ulid.ULID{}) && key.Compare(stop) >= 0 {
			break
		}
		if p, s, sealed, err := splitLog(key, v); err == nil && p == out[len(out)-1].key && s == seq+1 {
			out, seq = append(out, chained{key, sealed}), s
		}
	}
	return out
}

func (logLayout) exists(tx *bolt.Tx, runID string) bool {
	return tx.Bucket(startsBucket).Get([]byte(runID)) != nil
}

func (logLayout) first(tx *bolt.Tx, runID string) (ulid.ULID, []byte, bool) {
	first := tx.Bucket(startsBucket).Get([]byte(runID))
	if len(first) != len(ulid.ULID{}) {
		return ulid.ULID{}, nil, false
	}
	key := ulid.ULID(first)
	v := tx.Bucket(logBucket).Get(key[:])
	if v == nil {
		return key, nil, false
	}
	_, seq, sealed, err := splitLog(key, v)
	if err != nil || seq != 0 {
		return key, nil, false
	}
	return key, sealed, true
}

func (logLayout) entryKey(tx *bolt.Tx, runID string) []byte {
	if first := tx.Bucket(startsBucket).Get([]byte(runID)); first != nil {
		return bytes.Clone(first)
	}
	return nil
}

// entries lists the index with the run each entry is filed for, read from
// the starts bucket ("" for an entry no run's first key names).
func (logLayout) entries(tx *bolt.Tx, fn func(key, v []byte, runID string) error) error {
	runs := map[string]string{}
	if err := tx.Bucket(startsBucket).ForEach(func(k, v []byte) error {
		runs[string(v)] = string(k)
		return nil
	}); err != nil {
		return err
	}
	return tx.Bucket(indexBucket).ForEach(func(k, v []byte) error { return fn(k, v, runs[string(k)]) })
}

func (l logLayout) orphans(tx *bolt.Tx, index *bolt.Bucket) ([]string, error) {
	_, starts, err := l.buckets(tx)
	if err != nil {
		return nil, err
	}
	var out []string
	err = starts.ForEach(func(k, first []byte) error {
		if index.Get(first) == nil {
			out = append(out, string(k))
		}
		return nil
	})
	return out, err
}

// remove deletes the events the run's chain reaches, walking back from the
// last key and forward from the first (all of them in a sound store; in a
// damaged one, an event no link reaches stays, which only a full scan
// would find), and its first-key record.
func (l logLayout) remove(tx *bolt.Tx, runID string, info RunInfo, indexed bool) error {
	log, starts, err := l.buckets(tx)
	if err != nil {
		return err
	}
	chain, _, _, _ := l.chain(log, starts, runID, info, indexed)
	for _, e := range chain {
		if err := log.Delete(e.key[:]); err != nil {
			return err
		}
	}
	return starts.Delete([]byte(runID))
}
