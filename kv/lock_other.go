//go:build !unix

package kv

import (
	"os"
	"path/filepath"
	"time"
)

// lockFile leaves locking to bbolt on platforms without flock: the file
// check then runs before bbolt takes its lock.
func lockFile(*os.File, bool, time.Duration) error { return nil }

func unlockFile(*os.File) {}

func identity(path string, _ os.FileInfo) any {
	abs, err := filepath.Abs(path)
	if err != nil {
		return path
	}
	return abs
}

// mapFile does not map on these platforms: the file check reads.
func mapFile(*os.File, int64) ([]byte, func()) { return nil, func() {} }

// syncDirectory does nothing on these platforms: a directory cannot be
// opened for fsync there (Windows refuses to flush a directory handle), so
// a rename is as durable as the file system makes it.
func syncDirectory(string) error { return nil }
