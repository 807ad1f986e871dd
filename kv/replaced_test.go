package kv

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/proptest"
)

// TestOpenNoticesAFileReplacedUnderIt: the file a process opened
// is no longer the one at the path by the time it holds the lock (Compact
// renamed a new one over it); open says so.
func TestOpenNoticesAFileReplacedUnderIt(t *testing.T) {
	path, other := twoStores(t)
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
}

// TestAnOpenWaitingWhileCompactSwapsOpensTheNewFile: Open waits for the
// lock of the file at the path; when the file is replaced meanwhile (as
// Compact does), it opens again and gets the new file, not the old one.
func TestAnOpenWaitingWhileCompactSwapsOpensTheNewFile(t *testing.T) {
	path, other := twoStores(t)
	old, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := lockFile(old, true, time.Second); err != nil { // another process holds the old file
		t.Fatal(err)
	}
	opened := make(chan *Store, 1)
	go func() {
		s, err := Open(path, Options{NoSync: true, LockTimeout: 10 * time.Second})
		if err != nil {
			t.Error(err)
		}
		opened <- s
	}()
	time.Sleep(100 * time.Millisecond) // let Open reach the old file's lock
	if err := os.Rename(other, path); err != nil {
		t.Fatal(err)
	}
	unlockFile(old)
	s := <-opened
	if s == nil {
		return
	}
	defer s.Close()
	if got, err := s.Load(context.Background(), "moved"); err != nil || len(got) != 1 {
		t.Fatalf("Open got the old file: %d events of the new file's run (%v)", len(got), err)
	}
}

// twoStores makes a store at path and the store Compact would rename over
// it at other, which holds a run the first does not ("moved").
func twoStores(t *testing.T) (path, other string) {
	dir := t.TempDir()
	path, other = filepath.Join(dir, "s.db"), filepath.Join(dir, "new.db")
	for _, p := range []string{path, other} {
		s, err := Open(p, Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		if p == other {
			if _, err := s.Append(context.Background(), "moved", ulid.ULID{}, proptest.SoundStream("moved")[0]); err != nil {
				t.Fatal(err)
			}
		}
		s.Close()
	}
	return path, other
}
