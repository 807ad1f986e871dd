package kv

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
)

// TestEveryDamageIsCorruption: whatever is damaged in a file — an event's
// value, its link, an event missing, the index entry — every read reports
// it as damage (events.ErrCorruption and an *events.DamageError) as well
// as kv's own ErrCorrupt, in both formats.
func TestEveryDamageIsCorruption(t *testing.T) {
	for _, format := range formats {
		t.Run("format="+format, func(t *testing.T) {
			open := func(t *testing.T) seams.RunStore {
				s, err := Open(filepath.Join(t.TempDir(), "s.db"), Options{format: format})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				return s
			}
			damages := []proptest.StoreDamage{
				{Name: "a bit of a value flipped", At: 3, Apply: damageFile(func(tx *bolt.Tx, run string, stream []events.Envelope) error {
					return changeValue(tx, format, run, stream[3], func(v []byte) { v[len(v)-10] ^= 0x10 })
				})},
				{Name: "an event in the middle deleted", At: 6, Apply: damageFile(func(tx *bolt.Tx, run string, stream []events.Envelope) error {
					return deleteEvent(tx, format, run, stream[6].ID)
				})},
				{Name: "the last event deleted", At: 14, Apply: damageFile(func(tx *bolt.Tx, run string, stream []events.Envelope) error {
					return deleteEvent(tx, format, run, stream[14].ID)
				})},
				{Name: "the index entry altered", At: 15, Apply: damageFile(func(tx *bolt.Tx, run string, _ []events.Envelope) error {
					b := tx.Bucket(indexBucket)
					v := b.Get(entryOf(tx, run))
					return b.Put(entryOf(tx, run), []byte(strings.Replace(string(v), "finished", "running_", 1)))
				})},
				{Name: "the index entry deleted", At: 15, Apply: damageFile(func(tx *bolt.Tx, run string, _ []events.Envelope) error {
					return tx.Bucket(indexBucket).Delete(entryOf(tx, run))
				})},
			}
			if format == formatLog {
				damages = append(damages,
					proptest.StoreDamage{Name: "a link damaged", At: 9, Apply: damageFile(func(tx *bolt.Tx, run string, stream []events.Envelope) error {
						return changeValue(tx, format, run, stream[9], func(v []byte) { v[20] ^= 1 })
					})},
					proptest.StoreDamage{Name: "the index naming an earlier last event", At: 15, Apply: damageFile(func(tx *bolt.Tx, run string, stream []events.Envelope) error {
						return rewriteInfo(tx, run, func(info *RunInfo) { info.LastID = stream[13].ID })
					})})
			}
			proptest.CorruptionContract(t, open, damages)
		})
	}
}

// damageFile closes the store, changes its file with bbolt directly and
// opens it again.
func damageFile(change func(tx *bolt.Tx, run string, stream []events.Envelope) error) func(*testing.T, seams.RunStore, string, []events.Envelope) seams.RunStore {
	return func(t *testing.T, s seams.RunStore, run string, stream []events.Envelope) seams.RunStore {
		path := s.(*Store).Path()
		s.(*Store).Close()
		rawUpdate(t, path, func(tx *bolt.Tx) error { return change(tx, run, stream) })
		reopened, err := Open(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { reopened.Close() })
		return reopened
	}
}

// changeValue changes the value stored for env in run's stream, whatever
// the file's layout (in the log, the link header leads it).
func changeValue(tx *bolt.Tx, format, run string, env events.Envelope, change func(v []byte)) error {
	b := tx.Bucket(logBucket)
	if format == formatBuckets {
		b = tx.Bucket(runsBucket).Bucket([]byte(run))
	}
	v := bytes.Clone(b.Get(env.ID[:]))
	change(v)
	return b.Put(env.ID[:], v)
}
