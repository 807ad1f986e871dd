package kv

import (
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/events"
)

// A run's id is a key in one place only of a format 2 file: the starts
// bucket, where it names the run's first key (the index entry is filed
// under that first key, the log under the events' keys). A flipped bit in
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

// lostUnder is the key, near where runID would be filed, under which l
// keeps runID's stream though the key is not runID — a damaged copy of it
// — or "" when there is none. Call it only when runID has no stream on
// record under its own id.
func lostUnder(tx *bolt.Tx, l layout, runID string) string {
	ids := tx.Bucket(l.idBucket())
	if ids == nil {
		return ""
	}
	is := func(k []byte) bool {
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
		key, sealed, ok := l.first(tx, string(k))
		if !ok {
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
	k, _ := c.Seek([]byte(runID))
	for i := 0; k != nil && i < lostWindow; i++ {
		if is(k) {
			return string(k)
		}
		k, _ = c.Next()
	}
	if k, _ = c.Seek([]byte(runID)); k == nil {
		k, _ = c.Last()
	} else {
		k, _ = c.Prev()
	}
	for i := 0; k != nil && i < lostWindow; i++ {
		if is(k) {
			return string(k)
		}
		k, _ = c.Prev()
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
