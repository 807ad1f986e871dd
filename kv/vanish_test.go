package kv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
)

// idKeyBucket is the bucket whose keys are the runs' ids: the runs bucket
// in format 1, the starts bucket in format 2.
func idKeyBucket(format string) []byte {
	if format == formatBuckets {
		return runsBucket
	}
	return startsBucket
}

// idKeyOffset is where in the file at path the key runID is stored in the
// bucket named by idKeyBucket. The bytes bbolt's cursor hands out point
// into its mapping of the file, which begins at the file's first byte;
// but of an inline bucket that is not aligned bbolt reads a copy, and
// then each place the file holds the id is tried: the one whose flip
// (at, bit) changes the id's key to damaged.
func idKeyOffset(t *testing.T, path, format, runID string, at int, bit uint, damaged string) int {
	t.Helper()
	off := -1
	keys(t, path, format, func(db *bolt.DB, tx *bolt.Tx, k []byte) {
		if string(k) == runID {
			if o := int(uintptr(unsafe.Pointer(unsafe.SliceData(k))) - db.Info().Data); o >= 0 && int64(o) < tx.Size() {
				off = o
			}
		}
	})
	if off >= 0 {
		return off
	}
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	try := filepath.Join(t.TempDir(), "try.db")
	for from := 0; ; {
		i := bytes.Index(file[from:], []byte(runID))
		if i < 0 {
			t.Fatalf("bucket %s: no key %q found in the file", idKeyBucket(format), runID)
		}
		off, from = from+i, from+i+1
		b := bytes.Clone(file)
		b[off+at] ^= 1 << bit
		if err := os.WriteFile(try, b, 0o600); err != nil {
			t.Fatal(err)
		}
		found := map[string]bool{}
		keys(t, try, format, func(_ *bolt.DB, _ *bolt.Tx, k []byte) { found[string(k)] = true })
		if !found[runID] && found[damaged] {
			return off
		}
	}
}

// keys hands fn every key of the bucket named by idKeyBucket in the file
// at path.
func keys(t *testing.T, path, format string, fn func(db *bolt.DB, tx *bolt.Tx, k []byte)) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(idKeyBucket(format))
		if b == nil {
			return fmt.Errorf("no bucket %s", idKeyBucket(format))
		}
		return b.ForEach(func(k, _ []byte) error { fn(db, tx, k); return nil })
	})
	if err != nil {
		t.Fatal(err)
	}
}

// writeRuns writes a sound stream for each id into a new store file of the
// format and returns the file's bytes.
func writeRuns(t *testing.T, format string, ids []string) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.db")
	s, err := Open(path, Options{format: format, PageSize: 4096, NoServe: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if _, err := s.Append(context.Background(), id, ulid.ULID{}, proptest.SoundStream(id)...); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return file
}

// flipped opens a copy of file in which one bit of one byte of runID's id
// key is flipped, and returns the store and the id the key now spells.
func flipped(t *testing.T, file []byte, format, runID string, at int, bit uint) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.db")
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	b := []byte(runID)
	b[at] ^= 1 << bit
	damaged := string(b)
	off := idKeyOffset(t, path, format, runID, at, bit, damaged)
	file = append([]byte(nil), file...)
	if string(file[off:off+len(runID)]) != runID {
		t.Fatalf("the key is not at %d", off)
	}
	file[off+at] ^= 1 << bit
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(path, Options{NoServe: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, damaged
}

// TestADamagedRunIDKeyIsCorruption: a bit flipped in the key a run's id is
// stored under (format 2's starts bucket, format 1's runs bucket) does
// not make the run read as never written: every read of it, and an append
// that would start it again, fail with ErrCorrupt naming the id the key
// now spells; the runs around it read as before.
func TestADamagedRunIDKeyIsCorruption(t *testing.T) {
	ctx := context.Background()
	// Open refuses a file whose keys are out of order, so a flip that
	// goes unnoticed keeps the key between its neighbours: the last key
	// flipped up, one with room around it, or in a bucket of one leaf
	// the first key flipped down. The many ids leave room: each ends in a
	// 0 that a flip of its low four bits keeps in order. The few are the
	// damage corpus's (package proptest).
	var many, few []string
	for i := range 300 { // more than a 4 KiB leaf holds
		many = append(many, fmt.Sprintf("run-%04x", i*16))
	}
	for i := range 7 {
		few = append(few, fmt.Sprintf("run-%d", i))
	}
	type flip struct {
		ids     []string
		run     string
		at      int
		bit     uint
		damaged string
	}
	cases := []flip{
		{few, "run-6", 1, 3, "r}n-6"}, // the last key, up: the corpus's
		{few, "run-0", 0, 1, "pun-0"}, // the first key, down
		{many, "run-12b0", 1, 3, "r}n-12b0"},
		{many, "run-12b0", 0, 0, "sun-12b0"},
		{many, "run-0960", 7, 3, "run-0968"}, // keys with room around them
		{many, "run-0050", 7, 2, "run-0054"},
	}
	for i := 0; i < len(many); i += 9 { // the first and last keys of leaves among them
		cases = append(cases, flip{many, many[i], 7, 0, many[i][:7] + "1"})
	}
	for _, format := range formats {
		files := map[int][]byte{len(many): writeRuns(t, format, many), len(few): writeRuns(t, format, few)}
		for _, c := range cases {
			t.Run(fmt.Sprintf("format=%s/%s", format, c.run), func(t *testing.T) {
				s, damaged := flipped(t, files[len(c.ids)], format, c.run, c.at, c.bit)
				if damaged != c.damaged {
					t.Fatalf("the key now spells %q, the case says %q", damaged, c.damaged)
				}
				corrupt := func(what string, err error) {
					t.Helper()
					switch {
					case err == nil:
						t.Errorf("%s: no error", what)
					case !errors.Is(err, ErrCorrupt) || !errors.Is(err, events.ErrCorruption):
						t.Errorf("%s: %v, want ErrCorrupt", what, err)
					case !strings.Contains(err.Error(), strconv.Quote(c.run)):
						t.Errorf("%s: %v does not name %q", what, err, c.run)
					case format == formatLog && !strings.Contains(err.Error(), strconv.Quote(damaged)):
						t.Errorf("%s: %v does not name %q and %q", what, err, c.run, damaged)
					}
				}
				got, err := s.Load(ctx, c.run)
				corrupt("Load", err)
				if len(got) != 0 {
					t.Errorf("Load: %d events", len(got))
				}
				corrupt("Scan", s.Scan(ctx, c.run, func(events.Envelope) error { return nil }))
				_, err = s.LoadAfter(ctx, c.run, 0, ulid.ULID{})
				corrupt("LoadAfter(0)", err)
				_, err = s.LoadAfter(ctx, c.run, 3, ulid.Make())
				corrupt("LoadAfter(3)", err)
				// Describe reads the index: format 1 files the entry under
				// the run's id, which is sound.
				if info, err := s.Describe(ctx, c.run); err != nil || format == formatLog && info.Status != StatusCorrupt {
					t.Errorf("Describe: %+v, %v; want StatusCorrupt", info, err)
				}
				_, err = s.Append(ctx, c.run, ulid.ULID{}, proptest.SoundStream(c.run)...)
				corrupt("Append of its RunStarted", err)
				if got, err = s.Load(ctx, c.run); len(got) != 0 || !errors.Is(err, ErrCorrupt) {
					t.Errorf("Load after the refused append: %d events, %v", len(got), err)
				}
				if format == formatLog { // format 1 finds the run by its index entry, filed under its id
					other := c.ids[0]
					if other == c.run {
						other = c.ids[1]
					}
					started := events.RunStarted{RunID: c.run, SchemaVersion: events.CurrentSchemaVersion}
					_, err = s.ForkRun(ctx, c.run, started, other, ulid.ULID{}, 0)
					corrupt("ForkRun onto it", err)
					_, err = s.ForkRun(ctx, "fork", events.RunStarted{RunID: "fork", SchemaVersion: events.CurrentSchemaVersion}, c.run, ulid.ULID{}, 0)
					corrupt("ForkRun from it", err)
					_, err = s.RequestCancel(ctx, c.run, "test")
					corrupt("RequestCancel", err)
					corrupt("RequeueRun", s.RequeueRun(ctx, c.run))
					corrupt("DeleteRun", s.DeleteRun(ctx, c.run, true))
				}
				// Its neighbours, and runs one bit from it, read as before.
				for i := 0; i < len(c.ids); i += 1 + len(c.ids)/20 {
					id := c.ids[i]
					if id == c.run || id == damaged {
						continue
					}
					if got, err := s.Load(ctx, id); err != nil || len(got) != len(proptest.SoundStream(id)) {
						t.Errorf("Load(%q): %d events, %v", id, len(got), err)
					}
				}
			})
		}
	}
}

// TestRunIDsOneBitApartAreNoDamage: a run never written whose id is one
// bit from a run that is ("run-4" beside "run-6", "b" beside "a" and "c")
// reads as never written and starts as any new run does: only a key whose
// run's first event names the id that was asked for is damage.
func TestRunIDsOneBitApartAreNoDamage(t *testing.T) {
	ctx := context.Background()
	written := []string{"run-0", "run-6", "run-7", "a", "c", "run-2"}
	for _, format := range formats {
		t.Run("format="+format, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "s.db")
			if err := os.WriteFile(path, writeRuns(t, format, written), 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := Open(path, Options{NoServe: true})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			for _, id := range []string{"run-4", "run-1", "run-3", "b", "e", "run-5"} {
				if got, err := s.Load(ctx, id); err != nil || len(got) != 0 {
					t.Errorf("Load(%q): %d events, %v; want none, no error", id, len(got), err)
				}
				if _, err := s.Describe(ctx, id); !errors.Is(err, seams.ErrNoRun) {
					t.Errorf("Describe(%q): %v, want seams.ErrNoRun", id, err)
				}
				if _, err := s.Append(ctx, id, ulid.ULID{}, proptest.SoundStream(id)...); err != nil {
					t.Errorf("Append(%q): %v", id, err)
				}
			}
			for _, id := range append(written, "run-4", "b") {
				if got, err := s.Load(ctx, id); err != nil || len(got) != len(proptest.SoundStream(id)) {
					t.Errorf("Load(%q): %d events, %v", id, len(got), err)
				}
			}
		})
	}
}

// TestADamagedRunIDKeyIsFoundPastLaterRuns: runs started after the damage,
// whose ids sort between the lost id and its damaged copy, are filed
// between them; the damaged copy is still found past lostWindow-1 of them
// (each of which, one byte from the lost id, is looked at and is not it).
func TestADamagedRunIDKeyIsFoundPastLaterRuns(t *testing.T) {
	ctx := context.Background()
	var few []string
	for i := range 7 {
		few = append(few, fmt.Sprintf("run-%d", i))
	}
	for _, format := range formats {
		t.Run("format="+format, func(t *testing.T) {
			s, damaged := flipped(t, writeRuns(t, format, few), format, "run-6", 1, 3)
			const between = "789ABCDEFGHIJKLMNOPQRSTUVWXYZab" // "run-6" < "run-7" … "run-b" < "r}n-6"
			if len(between) != lostWindow-1 {
				t.Fatalf("%d runs between, want lostWindow-1", len(between))
			}
			for _, c := range between {
				id := "run-" + string(c)
				if _, err := s.Append(ctx, id, ulid.ULID{}, proptest.SoundStream(id)...); err != nil {
					t.Fatalf("Append(%q): %v", id, err)
				}
			}
			if _, err := s.Load(ctx, "run-6"); !errors.Is(err, ErrCorrupt) {
				t.Errorf("Load: %v, want ErrCorrupt", err)
			}
			_, err := s.Append(ctx, "run-6", ulid.ULID{}, proptest.SoundStream("run-6")...)
			if !errors.Is(err, ErrCorrupt) || format == formatLog && !strings.Contains(err.Error(), strconv.Quote(damaged)) {
				t.Errorf("Append: %v, want ErrCorrupt naming %q", err, damaged)
			}
		})
	}
}
