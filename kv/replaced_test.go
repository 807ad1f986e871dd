package kv

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestAFileReplacedWhileOpeningIsOpenedAgain: the file a process opened
// is no longer the one at the path by the time it holds the lock (Compact
// renamed a new one over it); open says so, and Open opens the new file.
func TestAFileReplacedWhileOpeningIsOpenedAgain(t *testing.T) {
	dir := t.TempDir()
	path, other := filepath.Join(dir, "s.db"), filepath.Join(dir, "new.db")
	for _, p := range []string{path, other} {
		s, err := Open(p, Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(other, path); err != nil { // what Compact does while f waits
		t.Fatal(err)
	}
	if _, err := open(f, path, Options{NoSync: true}, DefaultLockTimeout); !errors.Is(err, errReplaced) {
		t.Fatalf("open of a replaced file: %v", err)
	}
	s, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatalf("Open after the replacement: %v", err)
	}
	s.Close()
}
