package kv_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/oklog/ulid/v2"
	"github.com/vmihailenco/msgpack/v5"
	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/proptest"
)

// contents is every key and value of the file, nested buckets included,
// as "bucket/…/key = value" lines.
func contents(t *testing.T, path string) map[string][]byte {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	out := map[string][]byte{}
	var walk func(prefix string, b *bolt.Bucket) error
	walk = func(prefix string, b *bolt.Bucket) error {
		return b.ForEach(func(k, v []byte) error {
			if v == nil {
				return walk(prefix+string(k)+"/", b.Bucket(k))
			}
			out[prefix+fmt.Sprintf("%x", k)] = bytes.Clone(v)
			return nil
		})
	}
	err = db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error { return walk(string(name)+"/", b) })
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCompactKeepsEveryEventByteIdentical: after deleting most runs,
// Compact shrinks the file; every stored value of the runs left — events
// and index entries — is byte-identical under the same key, and the store
// opens and takes appends as before.
func TestCompactKeepsEveryEventByteIdentical(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	s, err := kv.Open(path, kv.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 60 {
		run := fmt.Sprint("run-", i)
		var tail ulid.ULID
		for _, ev := range proptest.SoundStream(run) {
			envs, err := s.Append(ctx, run, tail, ev)
			if err != nil {
				t.Fatal(err)
			}
			tail = envs[0].ID
		}
		if i%10 != 0 {
			if err := s.DeleteRun(ctx, run, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	usedBefore, _ := s.DataSize()
	s.Close()
	before := contents(t, path)
	res, err := kv.Compact(path, kv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.After > res.Before {
		t.Fatalf("compaction grew the file: %d -> %d bytes", res.Before, res.After)
	}
	if fi, _ := os.Stat(path); fi.Size() != res.After {
		t.Fatalf("the path holds %d bytes, compaction wrote %d", fi.Size(), res.After)
	}
	after := contents(t, path)
	if len(after) != len(before) {
		t.Fatalf("%d values before, %d after", len(before), len(after))
	}
	for k, v := range before {
		if !bytes.Equal(after[k], v) {
			t.Fatalf("%s changed", k)
		}
	}
	s, err = kv.Open(path, kv.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if usedAfter, _ := s.DataSize(); usedAfter >= usedBefore {
		t.Fatalf("compaction did not shrink the data: %d -> %d bytes", usedBefore, usedAfter)
	} else {
		t.Logf("pages in use: %d -> %d bytes", usedBefore, usedAfter)
	}
	runs, _ := s.Runs(ctx)
	if len(runs) != 6 {
		t.Fatalf("%d runs after compaction, want 6", len(runs))
	}
	for _, r := range runs {
		if _, err := s.Load(ctx, r.RunID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Append(ctx, "new", ulid.ULID{}, events.RunStarted{RunID: "new", SchemaVersion: events.CurrentSchemaVersion}); err != nil {
		t.Fatal(err)
	}
	t.Logf("60 runs, 54 deleted: %d -> %d bytes", res.Before, res.After)
}

// TestCompactMakesItsSwapDurable: after renaming the new file over the
// store, and before it returns, Compact syncs the store's directory —
// without that a power cut may leave the path naming the old file, and
// every append made after the compaction lost. A directory sync that fails
// is Compact's error (the new file is in place, but not durably).
func TestCompactMakesItsSwapDurable(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	s, err := kv.Open(path, kv.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	var tail ulid.ULID
	for _, ev := range proptest.SoundStream("r") {
		envs, err := s.Append(ctx, "r", tail, ev)
		if err != nil {
			t.Fatal(err)
		}
		tail = envs[0].ID
	}
	s.Close()

	old, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	var afterSwap []string // directories synced once the path named the new file
	kv.SetSyncDir(t, func(dir string) error {
		if now, err := os.Stat(path); err == nil && !os.SameFile(old, now) {
			afterSwap = append(afterSwap, dir)
		}
		return kv.SyncDirectory(dir)
	})
	if _, err := kv.Compact(path, kv.Options{}); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(afterSwap, filepath.Dir(path)) {
		t.Fatalf("Compact returned without syncing %s after the swap (synced after it: %q)", filepath.Dir(path), afterSwap)
	}

	refused := errors.New("fsync: input/output error")
	kv.SetSyncDir(t, func(string) error { return refused })
	_, err = kv.Compact(path, kv.Options{})
	if !errors.Is(err, refused) || !strings.Contains(err.Error(), path) {
		t.Fatalf("Compact with a failing directory sync returned %v, want an error naming %s and the sync's failure", err, path)
	}
	s, err = kv.Open(path, kv.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, err := s.Load(ctx, "r"); err != nil || len(got) != len(proptest.SoundStream("r")) {
		t.Fatalf("after the failed sync the store loads %d events (%v)", len(got), err)
	}
}

// TestCompactNeedsTheFileToItself: a store open in this process is not
// compacted under it.
func TestCompactNeedsTheFileToItself(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	s, err := kv.Open(path, kv.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := kv.Compact(path, kv.Options{}); err == nil {
		t.Fatal("compacted a store open for writing")
	}
}

// TestCompactMovesAFormat1StoreToOneLog: a store with a bucket per run
// (format 1), its runs' appends interleaved, comes out of Compact as one
// log: every event's value byte-identical under the same key (behind its
// link header), every index entry's fields unchanged (filed under the run's
// first key), every run loading to the same events, and the store taking
// appends in the log.
func TestCompactMovesAFormat1StoreToOneLog(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	s, err := kv.Open(path, kv.FormatBuckets(kv.Options{NoSync: true}))
	if err != nil {
		t.Fatal(err)
	}
	tails := map[string]ulid.ULID{}
	for j := range proptest.SoundStream("x") {
		for i := range 5 { // round-robin, so the runs' keys interleave
			run := fmt.Sprint("run-", i)
			envs, err := s.Append(ctx, run, tails[run], proptest.SoundStream(run)[j])
			if err != nil {
				t.Fatal(err)
			}
			tails[run] = envs[0].ID
		}
	}
	if err := s.DeleteRun(ctx, "run-3", false); err != nil {
		t.Fatal(err)
	}
	loaded := map[string][]events.Envelope{}
	for i := range 5 {
		run := fmt.Sprint("run-", i)
		loaded[run], _ = s.Load(ctx, run)
	}
	s.Close()
	before := contents(t, path)
	if _, err := kv.Compact(path, kv.Options{}); err != nil {
		t.Fatal(err)
	}
	after := contents(t, path)
	if string(after["polyloop/"+fmt.Sprintf("%x", "format")]) != "2" {
		t.Fatalf("format after compaction: %q", after["polyloop/"+fmt.Sprintf("%x", "format")])
	}
	moved := 0
	for k, v := range before {
		switch {
		case strings.HasPrefix(k, "index/"):
			// Filed under the run's first key in the log, the same fields.
			run := strings.TrimPrefix(k, "index/")
			first := after["starts/"+run]
			var was, is map[string]any
			if err := msgpack.Unmarshal(v, &was); err != nil {
				t.Fatal(err)
			}
			if err := msgpack.Unmarshal(after[fmt.Sprintf("index/%x", first)], &is); err != nil {
				t.Fatalf("index entry of %s: %v", k, err)
			}
			delete(was, "crc")
			delete(is, "crc")
			if !reflect.DeepEqual(was, is) {
				t.Fatalf("index entry %s changed: %v, now %v", k, was, is)
			}
		case strings.HasPrefix(k, "runs/"):
			key := k[strings.LastIndex(k, "/")+1:]
			if got := after["log/"+key]; len(got) != len(v)+28 || !bytes.Equal(got[28:], v) {
				t.Fatalf("event %s is not in the log byte-identical", k)
			}
			moved++
		}
	}
	if moved != 4*len(proptest.SoundStream("x")) {
		t.Fatalf("%d events compared, want 4 runs' worth", moved)
	}
	s, err = kv.Open(path, kv.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for run, want := range loaded {
		got, err := s.Load(ctx, run)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("%s loads %d events (%v), %d before", run, len(got), err, len(want))
		}
	}
	if _, err := s.Append(ctx, "new", ulid.ULID{}, events.RunStarted{RunID: "new", SchemaVersion: events.CurrentSchemaVersion}); err != nil {
		t.Fatal(err)
	}
}

// TestCompactRefusesAFormat1StoreThatCannotBeOneLog: two runs' buckets
// holding the same key cannot become one log; Compact says so and leaves
// the file as it was.
func TestCompactRefusesAFormat1StoreThatCannotBeOneLog(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	s, err := kv.Open(path, kv.FormatBuckets(kv.Options{NoSync: true}))
	if err != nil {
		t.Fatal(err)
	}
	for _, run := range []string{"a", "b"} {
		if _, err := s.Append(ctx, run, ulid.ULID{}, proptest.SoundStream(run)[:2]...); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	kv.RawUpdate(t, path, func(tx *bolt.Tx) error {
		runs := tx.Bucket([]byte("runs"))
		k, v := runs.Bucket([]byte("a")).Cursor().First()
		return runs.Bucket([]byte("b")).Put(bytes.Clone(k), bytes.Clone(v))
	})
	before, _ := os.ReadFile(path)
	if _, err := kv.Compact(path, kv.Options{}); !errors.Is(err, kv.ErrCorrupt) || !strings.Contains(err.Error(), "two runs") {
		t.Fatalf("Compact: %v", err)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Fatal("a refused compaction changed the file")
	}
}

// TestCompactGivesAnOldIndexEntryItsAnchors: an index entry from before the
// store kept a run's last key, count and checksum reads fine in a bucket
// per run; moved to the log, where the last key is how the run is found,
// it gets them from the stream, and the run loads and takes appends.
func TestCompactGivesAnOldIndexEntryItsAnchors(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	s, err := kv.Open(path, kv.FormatBuckets(kv.Options{NoSync: true}))
	if err != nil {
		t.Fatal(err)
	}
	envs, err := s.Append(ctx, "old", ulid.ULID{}, proptest.SoundStream("old")[:5]...)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	kv.RawUpdate(t, path, func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("index"))
		var m map[string]any
		if err := msgpack.Unmarshal(b.Get([]byte("old")), &m); err != nil {
			return err
		}
		delete(m, "last_id")
		delete(m, "events")
		delete(m, "crc")
		v, err := msgpack.Marshal(m)
		if err != nil {
			return err
		}
		return b.Put([]byte("old"), v)
	})
	if _, err := kv.Compact(path, kv.Options{NoSync: true}); err != nil {
		t.Fatal(err)
	}
	s, err = kv.Open(path, kv.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, err := s.Load(ctx, "old"); err != nil || len(got) != 5 {
		t.Fatalf("after compaction: %d events, %v", len(got), err)
	}
	if _, err := s.Append(ctx, "old", envs[4].ID, proptest.SoundStream("old")[5]); err != nil {
		t.Fatalf("append after compaction: %v", err)
	}
}
