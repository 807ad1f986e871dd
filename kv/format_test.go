package kv_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/proptest"
)

// TestWhatIsNotAStoreIsRefusedUntouched: an empty file, a text file, a
// directory and another application's bbolt file are refused with
// ErrNotAStore, read-only and read-write, their bytes unchanged.
func TestWhatIsNotAStoreIsRefusedUntouched(t *testing.T) {
	dir := t.TempDir()
	other := filepath.Join(dir, "other.db")
	db, err := bolt.Open(other, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("sessions"))
		if err != nil {
			return err
		}
		return b.Put([]byte("k"), []byte("v"))
	})
	db.Close()
	emptyBolt := filepath.Join(dir, "empty-bolt.db")
	db, err = bolt.Open(emptyBolt, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	empty := filepath.Join(dir, "empty.db")
	os.WriteFile(empty, nil, 0o600)
	tiny := filepath.Join(dir, "tiny.db")
	os.WriteFile(tiny, []byte("0123456789"), 0o600)
	text := filepath.Join(dir, "notes.txt")
	os.WriteFile(text, bytes.Repeat([]byte("not a store\n"), 1000), 0o600)
	sub := filepath.Join(dir, "a-directory")
	os.Mkdir(sub, 0o700)

	for _, path := range []string{other, emptyBolt, empty, tiny, text, sub} {
		before, _ := os.ReadFile(path)
		for _, ro := range []bool{true, false} {
			s, err := kv.Open(path, kv.Options{ReadOnly: ro})
			if err == nil {
				s.Close()
				t.Errorf("%s (read-only %t): opened", filepath.Base(path), ro)
				continue
			}
			if !errors.Is(err, kv.ErrNotAStore) {
				t.Errorf("%s (read-only %t): got %v, want ErrNotAStore", filepath.Base(path), ro, err)
			}
		}
		if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
			t.Errorf("%s: a refused open changed the file", filepath.Base(path))
		}
	}
}

// TestAStoreFromBeforeTheFormatMarkerStillOpens: a store holding only the
// runs and index buckets (as stores written before the marker) opens
// read-only as it is, and read-write gets the marker.
func TestAStoreFromBeforeTheFormatMarkerStillOpens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	s, err := kv.Open(path, kv.FormatBuckets(kv.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(context.Background(), "r", ulid.ULID{}, proptest.SoundStream("r")...); err != nil {
		t.Fatal(err)
	}
	s.Close()
	// As versions before the marker left it: the runs and index buckets
	// alone (the read-write Open above added the queue too).
	kv.RawUpdate(t, path, func(tx *bolt.Tx) error {
		return errors.Join(tx.DeleteBucket([]byte("polyloop")), tx.DeleteBucket([]byte("queue")))
	})
	for _, ro := range []bool{true, false, true} {
		s, err := kv.Open(path, kv.Options{ReadOnly: ro})
		if err != nil {
			t.Fatalf("read-only %t: %v", ro, err)
		}
		if got, err := s.Load(context.Background(), "r"); err != nil || len(got) != len(proptest.SoundStream("r")) {
			t.Fatalf("read-only %t: loaded %d events (%v)", ro, len(got), err)
		}
		s.Close()
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.View(func(tx *bolt.Tx) error {
		if tx.Bucket([]byte("polyloop")) == nil {
			t.Error("a read-write open did not add the format marker")
		}
		if tx.Bucket([]byte("queue")) == nil {
			t.Error("a read-write open did not add the queue")
		}
		return nil
	})
}

// TestASecondOpenInThisProcessSaysSo: while a store is open read-write in
// this process, another Open of it (by any path) fails at once with
// ErrLocked naming this process; readers share; after Close it opens.
func TestASecondOpenInThisProcessSaysSo(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.db")
	s, err := kv.Open(path, kv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []kv.Options{{}, {ReadOnly: true}} {
		_, err := kv.Open(filepath.Join(dir, ".", "s.db"), o)
		if !errors.Is(err, kv.ErrLocked) || !strings.Contains(err.Error(), "this process") {
			t.Fatalf("second open %+v: got %v, want ErrLocked by this process", o, err)
		}
	}
	s.Close()
	r1, err := kv.Open(path, kv.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := kv.Open(path, kv.Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("two readers: %v", err)
	}
	if _, err := kv.Open(path, kv.Options{}); !errors.Is(err, kv.ErrLocked) {
		t.Fatalf("a writer beside readers: got %v, want ErrLocked", err)
	}
	r1.Close()
	if _, err := kv.Open(path, kv.Options{}); !errors.Is(err, kv.ErrLocked) || !strings.Contains(err.Error(), "this process") {
		t.Fatalf("a writer while one reader is still open: got %v, want ErrLocked by this process", err)
	}
	r2.Close()
	w, err := kv.Open(path, kv.Options{})
	if err != nil {
		t.Fatalf("after the readers closed: %v", err)
	}
	w.Close()
}

// TestADamagedNewestMetaPageIsRefusedNotRolledBack: bbolt would fall back
// to the older meta page and silently drop the last transaction (with a
// durable never intent as that tail, Resume would execute it again). Open
// refuses, naming the page; AllowMetaRollback accepts and reports it.
func TestADamagedNewestMetaPageIsRefusedNotRolledBack(t *testing.T) {
	// One more transaction moves the newest meta to the other page: both
	// pages get to be the damaged newest one.
	for extra := range 2 {
		t.Run(fmt.Sprintf("extra transactions %d", extra), func(t *testing.T) { damagedNewestMeta(t, extra) })
	}
}

func damagedNewestMeta(t *testing.T, extra int) {
	path := filepath.Join(t.TempDir(), "s.db")
	s, err := kv.Open(path, kv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range extra {
		if _, err := s.Append(context.Background(), fmt.Sprint("other-", i), ulid.ULID{}, proptest.SoundStream(fmt.Sprint("other-", i))[0]); err != nil {
			t.Fatal(err)
		}
	}
	stream := proptest.SoundStream("r")
	envs, err := s.Append(context.Background(), "r", ulid.ULID{}, stream[:3]...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(context.Background(), "r", envs[2].ID, stream[3]); err != nil { // the never action intent
		t.Fatal(err)
	}
	s.Close()
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ps := int(binary.NativeEndian.Uint32(file[16+8:]))
	txid := func(page int) uint64 { return binary.NativeEndian.Uint64(file[page*ps+16+48:]) }
	newest := 0
	if txid(1) > txid(0) {
		newest = 1
	}
	file[newest*ps+16+56] ^= 0x01 // its checksum
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, ro := range []bool{true, false} {
		_, err := kv.Open(path, kv.Options{ReadOnly: ro})
		if !errors.Is(err, kv.ErrCorrupt) || !strings.Contains(err.Error(), fmt.Sprintf("meta page %d", newest)) {
			t.Fatalf("read-only %t: got %v, want ErrCorrupt naming meta page %d", ro, err, newest)
		}
	}
	s, err = kv.Open(path, kv.Options{ReadOnly: true, AllowMetaRollback: true})
	if err != nil {
		t.Fatalf("AllowMetaRollback: %v", err)
	}
	defer s.Close()
	if !strings.Contains(s.MetaRollback(), fmt.Sprintf("meta page %d", newest)) {
		t.Fatalf("MetaRollback() = %q, want it to name meta page %d", s.MetaRollback(), newest)
	}
	if got, err := s.Load(context.Background(), "r"); err != nil || len(got) != 3 {
		t.Fatalf("after the rollback the run holds %d events (%v), want the 3 of the older transaction", len(got), err)
	}
}
