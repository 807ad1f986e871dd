package kv_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/oklog/ulid/v2"
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
