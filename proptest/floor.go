package proptest

import (
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/events"
)

// BoltFloor is the physical floor the benchmarks compare against: one raw
// bbolt Update putting vals under fresh ULID keys in run's bucket nested
// under "runs", as kv.Store lays a stream out, with no index, checks or
// group commit.
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
