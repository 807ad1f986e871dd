package kvtest

import (
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/events"
)

// BoltFloor is the physical floor the benchmarks compare against: one raw
// bbolt Update putting vals under fresh ULID keys in run's bucket nested
// under "runs", as kv.Store laid a stream out before its log (format 1),
// with no index, checks or group commit. For a single run it writes what
// the log does (a leaf, its parents, the meta page); for many
// (BenchmarkConcurrentAppend's goroutines) it is a bucket per run.
// BenchmarkLayoutFloor compares the layouts with its own grouped rounds.
func BoltFloor(db *bolt.DB, ids *events.IDSource, run []byte, vals [][]byte) error {
	return db.Update(func(tx *bolt.Tx) error {
		root, err := tx.CreateBucketIfNotExists([]byte("runs"))
		if err != nil {
			return err
		}
		b, err := root.CreateBucketIfNotExists(run)
		if err != nil {
			return err
		}
		for _, v := range vals {
			id := ids.Next(time.Now())
			if err := b.Put(id[:], v); err != nil {
				return err
			}
		}
		return nil
	})
}
