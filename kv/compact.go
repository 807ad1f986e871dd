package kv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	bolt "go.etcd.io/bbolt"
)

// syncDir is syncDirectory, replaced by tests to watch when Compact makes
// its swap durable.
var syncDir = syncDirectory

// CompactResult is a compaction's file sizes.
type CompactResult struct{ Before, After int64 }

// Compact rewrites the store at path without its free pages (what deleted
// runs leave behind) and swaps the new file in atomically: every run's
// events stay byte-identical under the same keys, and the path holds the
// old file or the new one, never half of either. A format 1 file (a bucket
// per run) comes out in the current format, one log: its events' values
// byte-identical under the same keys, each behind its link header; each
// index entry is filed under its run's first key and sealed again for it,
// with the last key and count filled in from the stream where an entry
// from before they were kept lacks them. It needs the file to
// itself (Open's lock): run it while no process has the store open. A
// process that opens the path meanwhile waits for the lock and then opens
// the new file (Open notices a file replaced under it and opens again).
//
// The new file is built beside the old one, so the directory must have
// room for both for a moment. The swap is durable when Compact returns nil:
// the directory is synced after the rename (where the platform can sync a
// directory; not on Windows). An error after the rename says so: the path
// then holds the new file, but a power cut may bring the old one back.
func Compact(path string, o Options) (CompactResult, error) {
	var res CompactResult
	if o.ReadOnly {
		return res, ErrReadOnly
	}
	src, err := Open(path, o)
	if err != nil {
		return res, err
	}
	defer src.Close()
	if fi, err := src.file.Stat(); err == nil {
		res.Before = fi.Size()
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".polyloop-compact-*.db")
	if err != nil {
		return res, fmt.Errorf("kv: compact %s: %w", path, err)
	}
	name := tmp.Name()
	tmp.Close()
	defer os.Remove(name) // after a successful rename there is nothing left to remove
	dst, err := bolt.Open(name, 0o600, &bolt.Options{NoSync: o.NoSync, NoFreelistSync: true, FreelistType: bolt.FreelistMapType, PageSize: pageSizeOf(o)})
	if err != nil {
		return res, fmt.Errorf("kv: compact %s: %w", path, err)
	}
	err = withFaultsAsPanics(func() error {
		if _, ok := src.layout.(bucketLayout); ok {
			return upgrade(dst, src.db) // format 1 comes out as one log
		}
		return bolt.Compact(dst, src.db, 64<<20)
	})
	if err == nil && !o.NoSync {
		err = dst.Sync()
	}
	if err := errors.Join(err, dst.Close()); err != nil {
		return res, fmt.Errorf("kv: compact %s: %w", path, err)
	}
	// Hold the new file's lock across the swap, so nobody opens it before
	// it is in place and the old one closed.
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		return res, fmt.Errorf("kv: compact %s: %w", path, err)
	}
	defer f.Close()
	if err := lockFile(f, true, o.LockTimeout); err != nil {
		return res, fmt.Errorf("kv: compact %s: lock the new file: %w", path, err)
	}
	defer unlockFile(f)
	if err := f.Sync(); err != nil {
		return res, fmt.Errorf("kv: compact %s: %w", path, err)
	}
	if err := os.Rename(name, path); err != nil {
		return res, fmt.Errorf("kv: compact %s: swap in the new file: %w", path, err)
	}
	// The rename is durable only once the directory is: until then a power
	// cut may bring the old file back, and every append after this call
	// with it lost.
	if err := syncDir(filepath.Dir(path)); err != nil {
		return res, fmt.Errorf("kv: compact %s: the new file is in place, but syncing its directory failed, so a power cut may bring the old file back: %w", path, err)
	}
	if fi, err := f.Stat(); err == nil {
		res.After = fi.Size()
	}
	return res, nil
}
