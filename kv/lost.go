package kv

import (
	"bytes"
	"fmt"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/events"
)

// A format 2 file finds a run by its id through one key only: the starts
// bucket's, naming the run's first key (the index entry is filed under
// that first key, the log under the events' keys). A flipped bit in
// that key makes the run vanish: its id finds nothing, and it would read
// as a run never written — and be started again. So where a lookup of a
// run finds nothing (a miss: rare, a new run's first append or a question
// about an id never used), lostUnder looks for a damaged copy of the id.
//
// Where to look: Open refuses a file whose keys are out of order (the
// file check), so a damaged key that passed it sorts where its run's id
// sorted, between the same neighbours; bbolt's cursor, seeking the id,
// lands on it or on the key after it. Runs started since, whose ids fall
// between the id and its damaged copy, are filed between them; lostWindow
// keys either side leave room for that many, whatever the page size (the
// window walks the cursor, across leaves). A key is a candidate when it is
// as long as the id and differs from it in at most lostBytes bytes (one
// flipped bit changes one), and it is the run's only when its first event
// is sealed for the id and is the RunStarted of a run of that id: an id
// one bit from another run's ("run-6", "run-7") is no damage.
const (
	lostWindow = 32
	lostBytes  = 2
)

// idBucket is the bucket whose keys are the runs' ids: runsBucket in
// format 1, startsBucket in format 2.
func (bucketLayout) idBucket() []byte { return runsBucket }
func (logLayout) idBucket() []byte    { return startsBucket }

// firstAt is first for the run filed under the id bucket's key k, whose
// value is v.
func (l bucketLayout) firstAt(tx *bolt.Tx, k, _ []byte) (ulid.ULID, []byte, bool) {
	return l.first(tx, string(k))
}

// firstAt is first for the run filed under the starts bucket's key k,
// whose value v is the run's first key: one lookup, in the log.
func (logLayout) firstAt(tx *bolt.Tx, _, v []byte) (ulid.ULID, []byte, bool) {
	if len(v) != len(ulid.ULID{}) {
		return ulid.ULID{}, nil, false
	}
	key := ulid.ULID(v)
	_, seq, sealed, err := splitLog(key, tx.Bucket(logBucket).Get(key[:]))
	if err != nil || seq != 0 {
		return key, nil, false
	}
	return key, sealed, true
}

// lostUnder is the key, near where runID would be filed, under which l
// keeps runID's stream though the key is not runID — a damaged copy of it
// — or "" when there is none. Call it only when runID has no stream on
// record under its own id.
func lostUnder(tx *bolt.Tx, l layout, runID string) string {
	ids := tx.Bucket(l.idBucket())
	if ids == nil {
		return ""
	}
	is := func(k, v []byte) bool {
		if len(k) != len(runID) || string(k) == runID {
			return false
		}
		differ := 0
		for i := range k {
			if k[i] != runID[i] {
				differ++
			}
		}
		if differ > lostBytes {
			return false
		}
		key, sealed, ok := l.firstAt(tx, k, v)
		if !ok {
			return false
		}
		if bytes.Contains(sealed, k) && !bytes.Contains(sealed, []byte(runID)) {
			// The RunStarted of the key's own run, as its id spells it
			// (runID's would spell runID, unless compressed; then it
			// spells neither): no need to decode it.
			return false
		}
		env, err := events.Unmarshal(runID, key, sealed)
		if err != nil {
			return false
		}
		started, ok := events.As[events.RunStarted](env.Event)
		return ok && started.RunID == runID
	}
	c := ids.Cursor()
	k, v := c.Seek([]byte(runID))
	for i := 0; k != nil && i < lostWindow; i++ {
		if is(k, v) {
			return string(k)
		}
		k, v = c.Next()
	}
	if k, _ = c.Seek([]byte(runID)); k == nil {
		k, v = c.Last()
	} else {
		k, v = c.Prev()
	}
	for i := 0; k != nil && i < lostWindow; i++ {
		if is(k, v) {
			return string(k)
		}
		k, v = c.Prev()
	}
	return ""
}

// lost is why runID, which has no stream on record under its own id, is
// damage rather than a run never written (lostUnder), or nil. The error
// does not wrap ErrCorrupt: callers say what they were doing.
func (s *Store) lost(tx *bolt.Tx, runID string) error {
	under := lostUnder(tx, s.layout, runID)
	if under == "" {
		return nil
	}
	return fmt.Errorf("run %q is on record under %q, a damaged copy of its id", runID, under)
}
