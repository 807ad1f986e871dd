package kv

import (
	"errors"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// FormatBuckets makes o create a format 1 store (a nested bucket per run),
// as versions before the log wrote them, for tests of files made then.
func FormatBuckets(o Options) Options {
	o.format = formatBuckets
	return o
}

// rawUpdate changes the closed store file at path with bbolt directly, as
// damage or another version's writer would.
func rawUpdate(t *testing.T, path string, change func(tx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoFreelistSync: true})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(change)
	if err := errors.Join(err, db.Close()); err != nil {
		t.Fatal(err)
	}
}

// RawUpdate is rawUpdate, for the external tests.
var RawUpdate = rawUpdate

// SyncDirectory is the directory sync the store uses.
var SyncDirectory = syncDirectory

// SetSyncDir makes the store sync directories with f until the test ends.
func SetSyncDir(t *testing.T, f func(dir string) error) {
	old := syncDir
	syncDir = f
	t.Cleanup(func() { syncDir = old })
}
