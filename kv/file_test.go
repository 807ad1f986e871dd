package kv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv/internal/boltpage"
	"github.com/polyloop/polyloop/proptest"
)

// damagedStore writes runs A (multi-page) and B (inline), then lets damage
// change the file's pages in place: page(id) reads a page, put(id, p)
// writes it back. It returns the path.
func damagedStore(t *testing.T, syncFreelist bool, damage func(t *testing.T, f *pages)) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.db")
	// The damage below is placed in 4 KiB pages, in a format 1 file, whose
	// nested buckets (one of them inline) give the file check the most
	// bbolt structure to refuse.
	s, err := Open(path, Options{PageSize: 4096, format: formatBuckets})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := s.Append(ctx, "A", ulid.ULID{}, proptest.SoundStream("A")...); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, "B", ulid.ULID{}, proptest.SoundStream("B")[:1]...); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if syncFreelist {
		// bbolt with its default options writes the freelist out.
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		db.Close()
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	f := &pages{t: t, path: path, size: int64(db.Info().PageSize)}
	db.View(func(tx *bolt.Tx) error {
		runs := tx.Bucket(runsBucket)
		f.runsRoot, f.rootA = uint64(runs.Root()), uint64(runs.Bucket([]byte("A")).Root())
		if runs.Bucket([]byte("B")).Root() != 0 {
			t.Fatal("run B is not an inline bucket")
		}
		return nil
	})
	db.Close()
	damage(t, f)
	return path
}

// pages reads and writes a bbolt file's pages for damage tests.
type pages struct {
	t               *testing.T
	path            string
	size            int64
	runsRoot, rootA uint64
}

func (f *pages) page(id uint64) []byte {
	b, err := os.ReadFile(f.path)
	if err != nil {
		f.t.Fatal(err)
	}
	return b[int64(id)*f.size : int64(id+1)*f.size]
}

func (f *pages) put(id uint64, p []byte) {
	fh, err := os.OpenFile(f.path, os.O_RDWR, 0)
	if err != nil {
		f.t.Fatal(err)
	}
	defer fh.Close()
	if _, err := fh.WriteAt(p, int64(id)*f.size); err != nil {
		f.t.Fatal(err)
	}
}

// newestMeta is the file's newest meta page.
func (f *pages) newestMeta() meta {
	m := parseMeta(0, f.page(0))
	if m1 := parseMeta(1, f.page(1)); m1.txid > m.txid {
		m = m1
	}
	return m
}

// freelistPage is the synced freelist's page id.
func (f *pages) freelistPage(t *testing.T) uint64 {
	m := f.newestMeta()
	if m.freelist == boltpage.NoFreelist {
		t.Fatal("the freelist was not synced")
	}
	return m.freelist
}

// hwm is the newest meta's high-water mark.
func (f *pages) hwm(*testing.T) uint64 { return f.newestMeta().pgid }

// value returns the offset in p of the value of the leaf element with key.
func value(t *testing.T, p []byte, key string) int {
	for i := range int(order.Uint16(p[boltpage.PageCount:])) {
		off := boltpage.HeaderSize + i*boltpage.ElemSize
		pos, ksize := int(order.Uint32(p[off+boltpage.LeafPos:])), int(order.Uint32(p[off+boltpage.LeafKeySize:]))
		if string(p[off+pos:off+pos+ksize]) == key {
			return off + pos + ksize
		}
	}
	t.Fatalf("no element %q", key)
	return 0
}

// TestTheFileCheckRefusesWhatBboltWouldMisuse: damage that leaves every
// page in bounds and of the right type, yet on the next write would make
// bbolt free or reuse a page in use, is refused at open — read-only and
// read-write — naming what is wrong.
func TestTheFileCheckRefusesWhatBboltWouldMisuse(t *testing.T) {
	cases := []struct {
		name   string
		synced bool
		damage func(t *testing.T, f *pages)
		want   string
	}{
		{"an inline bucket's page names a real page", false, func(t *testing.T, f *pages) {
			p := f.page(f.runsRoot)
			v := value(t, p, "B")
			order.PutUint64(p[v+boltpage.BucketHeaderSize:], f.rootA) // the inline page's id
			f.put(f.runsRoot, p)
		}, "the inline bucket's page claims id"},
		{"a synced freelist lists a page in use", true, func(t *testing.T, f *pages) {
			id := f.freelistPage(t)
			p := f.page(id)
			order.PutUint16(p[boltpage.PageCount:], 1)
			order.PutUint64(p[boltpage.HeaderSize:], f.rootA)
			f.put(id, p)
		}, "which is in use"},
		{"a synced freelist claims more entries than its page holds", true, func(t *testing.T, f *pages) {
			id := f.freelistPage(t)
			p := f.page(id)
			order.PutUint16(p[boltpage.PageCount:], uint16(f.size/8)) // one more than fits after the header
			f.put(id, p)
		}, "more than it holds"},
		{"a synced freelist lists the high-water mark", true, func(t *testing.T, f *pages) {
			id := f.freelistPage(t)
			p := f.page(id)
			order.PutUint16(p[boltpage.PageCount:], 1)
			order.PutUint64(p[boltpage.HeaderSize:], f.hwm(t))
			f.put(id, p)
		}, "outside the file's"},
		{"two buckets name one root page", false, func(t *testing.T, f *pages) {
			p := f.page(f.runsRoot)
			v := value(t, p, "B")
			order.PutUint64(p[v:], f.rootA) // B's bucket header: its root is A's
			f.put(f.runsRoot, p)
		}, "referenced twice"},
		{"two elements share their data", false, func(t *testing.T, f *pages) {
			p := f.page(f.runsRoot)
			// element 1 points at element 0's data
			e0, e1 := boltpage.HeaderSize, boltpage.HeaderSize+boltpage.ElemSize
			order.PutUint32(p[e1+boltpage.LeafPos:], uint32(e0+int(order.Uint32(p[e0+boltpage.LeafPos:]))-e1))
			f.put(f.runsRoot, p)
		}, "overlaps"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := damagedStore(t, c.synced, c.damage)
			for _, ro := range []bool{true, false} {
				s, err := Open(path, Options{ReadOnly: ro})
				if err == nil {
					s.Close()
					t.Fatalf("read-only %t: opened", ro)
				}
				if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("read-only %t: got %v, want ErrCorrupt saying %q", ro, err, c.want)
				}
			}
		})
	}
}

// TestADeeplyNestedIndexEntryIsDamageNotACrash: an index entry holding
// 100,000 nested arrays is listed as damaged and refused by Load, instead
// of overflowing the decoder's stack.
func TestADeeplyNestedIndexEntryIsDamageNotACrash(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	s, err := Open(path, Options{PageSize: 4096}) // the damage below is placed in 4 KiB pages
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(context.Background(), "A", ulid.ULID{}, proptest.SoundStream("A")...); err != nil {
		t.Fatal(err)
	}
	s.Close()
	v := append([]byte{0x81, 0xa1, 'x'}, []byte(strings.Repeat("\x91", 100_000))...)
	rawUpdate(t, path, func(tx *bolt.Tx) error { return tx.Bucket(indexBucket).Put(entryOf(tx, "A"), append(v, 0xc0)) })
	s, err = Open(path, Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	runs, err := s.Runs(context.Background())
	if err != nil || len(runs) != 1 || runs[0].Status != StatusCorrupt {
		t.Fatalf("Runs: %+v, %v", runs, err)
	}
	if _, err := s.Load(context.Background(), "A"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Load: %v", err)
	}
}

// TestAnAlteredIndexEntryIsDamage: an index entry whose fields were changed
// (its msgpack intact, its checksum not) is listed as damaged and refused
// by Load and Append, instead of steering listings and the append rules.
func TestAnAlteredIndexEntryIsDamage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	s, err := Open(path, Options{PageSize: 4096}) // the damage below is placed in 4 KiB pages
	if err != nil {
		t.Fatal(err)
	}
	envs, err := s.Append(context.Background(), "A", ulid.ULID{}, proptest.SoundStream("A")[:2]...)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Millisecond) // a later millisecond for the last event
	more, err := s.Append(context.Background(), "A", envs[1].ID, proptest.SoundStream("A")[2])
	if err != nil {
		t.Fatal(err)
	}
	envs = append(envs, more...)
	info, _ := s.Runs(context.Background())
	if first := info[0].FirstEvent; !first.Equal(envs[0].Time()) || info[0].LastID != envs[2].ID {
		t.Fatalf("index entry %+v does not anchor the stream's first time and last key", info[0])
	}
	s.Close()
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		b := tx.Bucket(indexBucket)
		v := b.Get(entryOf(tx, "A"))
		return b.Put(entryOf(tx, "A"), []byte(strings.Replace(string(v), "running", "finishe", 1)))
	})
	s, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if runs, _ := s.Runs(context.Background()); len(runs) != 1 || runs[0].Status != StatusCorrupt {
		t.Fatalf("Runs: %+v", runs)
	}
	if _, err := s.Load(context.Background(), "A"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Load: %v", err)
	}
	if _, err := s.Append(context.Background(), "A", envs[2].ID, proptest.SoundStream("A")[3]); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Append: %v", err)
	}
}

// formats are the store formats every layout-specific damage test runs in.
var formats = []string{formatBuckets, formatLog}

// deleteEvent deletes one event of run from the file's stream, whatever its
// layout, leaving everything else (the index entry, the other events) as it
// was.
func deleteEvent(tx *bolt.Tx, format, run string, key ulid.ULID) error {
	if format == formatBuckets {
		return tx.Bucket(runsBucket).Bucket([]byte(run)).Delete(key[:])
	}
	return tx.Bucket(logBucket).Delete(key[:])
}

// TestAMissingEventIsDamage: an event deleted from a stream — in the middle
// or at the tail, each value's checksum intact — is seen through the index
// entry's anchors (and in the log, the broken chain), which no per-value
// checksum could do for the tail.
func TestAMissingEventIsDamage(t *testing.T) {
	for _, format := range formats {
		for _, which := range []string{"middle", "first", "tail", "index names another tail"} {
			t.Run("format="+format+"/"+which, func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "s.db")
				s, err := Open(path, Options{PageSize: 4096, format: format})
				if err != nil {
					t.Fatal(err)
				}
				envs, err := s.Append(context.Background(), "A", ulid.ULID{}, proptest.SoundStream("A")[:5]...)
				if err != nil {
					t.Fatal(err)
				}
				s.Close()
				victim := map[string]ulid.ULID{"middle": envs[2].ID, "first": envs[0].ID, "tail": envs[4].ID}[which]
				rawUpdate(t, path, func(tx *bolt.Tx) error {
					if which == "index names another tail" {
						// The count still matches; only the last key does not.
						info, _, err := readInfo(tx.Bucket(indexBucket), entryOf(tx, "A"), "A")
						if err != nil {
							return err
						}
						info.LastID = envs[3].ID
						_, err = writeInfo(tx.Bucket(indexBucket), entryOf(tx, "A"), info)
						return err
					}
					return deleteEvent(tx, format, "A", victim)
				})
				s, err = Open(path, Options{ReadOnly: true})
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				got, err := s.Load(context.Background(), "A")
				if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "missing") ||
					which == "index names another tail" && !strings.Contains(err.Error(), "last event") {
					t.Fatalf("Load after deleting the %s event: %d events, %v", which, len(got), err)
				}
				// Every event still stored comes back beside the damage.
				if want := map[bool]int{true: 5, false: 4}[which == "index names another tail"]; len(got) != want {
					t.Fatalf("Load after deleting the %s event: %d events, want %d", which, len(got), want)
				}
				// Scan hands over the same events, then fails the same way.
				n := 0
				serr := s.Scan(context.Background(), "A", func(events.Envelope) error { n++; return nil })
				var damage *events.DamageError
				if n != len(got) || serr == nil || serr.Error() != err.Error() || !errors.As(serr, &damage) {
					t.Fatalf("Scan: %d events (Load %d), %v", n, len(got), serr)
				}
			})
		}
	}
}

// TestADamagedLinkIsDamage: in the log, a value whose link to the run's
// previous event was altered (the event itself intact) is refused by its
// link checksum, not followed into another run's events or a loop.
func TestADamagedLinkIsDamage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	envs, err := s.Append(ctx, "A", ulid.ULID{}, proptest.SoundStream("A")[:4]...)
	if err != nil {
		t.Fatal(err)
	}
	other, err := s.Append(ctx, "B", ulid.ULID{}, proptest.SoundStream("B")[:2]...)
	if err != nil {
		t.Fatal(err)
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		log := tx.Bucket(logBucket)
		v := append([]byte(nil), log.Get(envs[2].ID[:])...)
		copy(v, other[0].ID[:]) // now names run B's first event
		return log.Put(envs[2].ID[:], v)
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Load(ctx, "A")
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "link") {
		t.Fatalf("Load with a damaged link: %d events, %v", len(got), err)
	}
	s.Close()
}

// TestAppendRefusesARunItsStoreContradicts: an append to a run whose index
// entry names another last key, or whose stream has no index entry (in the
// log: a first event on record; in buckets: a plain value instead of a
// stream under its id), is refused for that run alone; an append of another
// run in the same store still lands.
func TestAppendRefusesARunItsStoreContradicts(t *testing.T) {
	for _, format := range formats {
		t.Run("format="+format, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "s.db")
			s, err := Open(path, Options{PageSize: 4096, format: format})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			envs, err := s.Append(ctx, "A", ulid.ULID{}, proptest.SoundStream("A")[:2]...)
			if err != nil {
				t.Fatal(err)
			}
			err = s.db.Update(func(tx *bolt.Tx) error {
				info, _, err := readInfo(tx.Bucket(indexBucket), entryOf(tx, "A"), "A")
				if err != nil {
					return err
				}
				info.LastID = envs[0].ID // sealed with a valid checksum, but wrong
				if _, err := writeInfo(tx.Bucket(indexBucket), entryOf(tx, "A"), info); err != nil {
					return err
				}
				if format == formatBuckets {
					return tx.Bucket(runsBucket).Put([]byte("V"), []byte("not a stream"))
				}
				return tx.Bucket(startsBucket).Put([]byte("V"), envs[1].ID[:]) // a first key no entry is filed under
			})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Append(ctx, "A", envs[1].ID, proptest.SoundStream("A")[2]); !errors.Is(err, ErrCorrupt) || !errors.Is(err, events.ErrCorruption) || !strings.Contains(err.Error(), "last event") {
				t.Fatalf("append to a run whose index names another tail: %v", err)
			}
			want := map[string]string{formatBuckets: "not a stream", formatLog: "no index entry"}[format]
			if _, err := s.Append(ctx, "V", ulid.ULID{}, proptest.SoundStream("V")[0]); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), want) {
				t.Fatalf("append to a run id with a stream but no index entry: %v", err)
			}
			if _, err := s.Append(ctx, "B", ulid.ULID{}, proptest.SoundStream("B")[0]); err != nil {
				t.Fatalf("another run: %v", err)
			}
			s.Close()
		})
	}
}

// TestAMetaPageBboltWouldStillUseIsNeverRolledBack: the newest meta page
// keeps a valid checksum (bbolt would open it) but names a root past its
// own high-water mark. Refused — with AllowMetaRollback too: falling back
// is only safe from a page bbolt itself rejects.
func TestAMetaPageBboltWouldStillUseIsNeverRolledBack(t *testing.T) {
	path := damagedStore(t, false, func(t *testing.T, f *pages) {
		newest := uint64(0)
		if parseMeta(1, f.page(1)).txid > parseMeta(0, f.page(0)).txid {
			newest = 1
		}
		p := f.page(newest)
		m := p[boltpage.HeaderSize:]
		order.PutUint64(m[boltpage.MetaPgid:], order.Uint64(m[boltpage.MetaRoot:])) // high-water mark = root: the root is past it
		h := fnv.New64a()
		h.Write(m[:boltpage.MetaChecksum])
		order.PutUint64(m[boltpage.MetaChecksum:], h.Sum64()) // a checksum bbolt accepts
		f.put(newest, p)
	})
	for _, o := range []Options{{}, {AllowMetaRollback: true}, {ReadOnly: true, AllowMetaRollback: true}} {
		s, err := Open(path, o)
		if err == nil {
			s.Close()
			t.Fatalf("%+v: opened", o)
		}
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "bbolt itself would open the damaged page") {
			t.Fatalf("%+v: got %v", o, err)
		}
	}
}

// TestARunOutlivesItsIndexEntry: a run whose index entry is damaged, or
// gone, still loads every event it has (beside the damage), in either
// format, and a forced delete removes all of them.
func TestARunOutlivesItsIndexEntry(t *testing.T) {
	ctx := context.Background()
	for _, format := range formats {
		for _, damage := range []string{"altered", "gone"} {
			t.Run("format="+format+"/"+damage, func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "s.db")
				s, err := Open(path, Options{format: format})
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				if _, err := s.Append(ctx, "A", ulid.ULID{}, proptest.SoundStream("A")[:5]...); err != nil {
					t.Fatal(err)
				}
				if _, err := s.Append(ctx, "B", ulid.ULID{}, proptest.SoundStream("B")[:3]...); err != nil {
					t.Fatal(err)
				}
				err = s.db.Update(func(tx *bolt.Tx) error {
					index := tx.Bucket(indexBucket)
					if damage == "gone" {
						return index.Delete(entryOf(tx, "A"))
					}
					v := bytes.Clone(index.Get(entryOf(tx, "A")))
					v[len(v)-1] ^= 1 // the entry's checksum fails
					return index.Put(entryOf(tx, "A"), v)
				})
				if err != nil {
					t.Fatal(err)
				}
				got, err := s.Load(ctx, "A")
				if !errors.Is(err, ErrCorrupt) || len(got) != 5 {
					t.Fatalf("Load: %d events, %v", len(got), err)
				}
				if runs, _ := s.Runs(ctx); len(runs) != 2 || runs[0].Status != StatusCorrupt {
					t.Fatalf("Runs: %+v", runs)
				}
				if err := s.DeleteRun(ctx, "A", true); err != nil {
					t.Fatal(err)
				}
				if got, err := s.Load(ctx, "A"); err != nil || len(got) != 0 {
					t.Fatalf("after a forced delete: %d events, %v", len(got), err)
				}
				if got, err := s.Load(ctx, "B"); err != nil || len(got) != 3 {
					t.Fatalf("run B after A's delete: %d events, %v", len(got), err)
				}
				if format == formatLog {
					s.db.View(func(tx *bolt.Tx) error {
						if n := tx.Bucket(logBucket).Stats().KeyN; n != 3 {
							t.Errorf("the log holds %d events after A's delete, want B's 3", n)
						}
						return nil
					})
				}
			})
		}
	}
}

// TestTheLogNamesWhatContradictsAnAppend: in the log, an append to a run
// whose index entry and chain disagree is refused, naming which check
// failed; and a run whose first event on record is not where its chain
// starts loads as damaged.
func TestTheLogNamesWhatContradictsAnAppend(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name, want string
		damage     func(tx *bolt.Tx, envs []events.Envelope) error
	}{
		{"no last key", "names no last event", func(tx *bolt.Tx, envs []events.Envelope) error {
			return rewriteInfo(tx, "A", func(info *RunInfo) { info.LastID = ulid.ULID{} })
		}},
		{"a last key not in the log", "not in the log", func(tx *bolt.Tx, envs []events.Envelope) error {
			return rewriteInfo(tx, "A", func(info *RunInfo) { info.LastID[15]++ })
		}},
		{"an earlier event as the last", "counts 3 events", func(tx *bolt.Tx, envs []events.Envelope) error {
			return rewriteInfo(tx, "A", func(info *RunInfo) { info.LastID = envs[1].ID })
		}},
		{"the last event's link damaged", "fails its checksum", func(tx *bolt.Tx, envs []events.Envelope) error {
			log := tx.Bucket(logBucket)
			v := bytes.Clone(log.Get(envs[2].ID[:]))
			v[20] ^= 1 // the event number
			return log.Put(envs[2].ID[:], v)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "s.db")
			s, err := Open(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			envs, err := s.Append(ctx, "A", ulid.ULID{}, proptest.SoundStream("A")[:3]...)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.db.Update(func(tx *bolt.Tx) error { return c.damage(tx, envs) }); err != nil {
				t.Fatal(err)
			}
			// Damaged between two processes' lifetimes: a store that wrote
			// the entry itself trusts it for its next append (see
			// writtenEntries), and Load reports the damage.
			s.Close()
			if s, err = Open(path, Options{}); err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			_, err = s.Append(ctx, "A", envs[2].ID, proptest.SoundStream("A")[3])
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("append: %v, want ErrCorrupt naming %q", err, c.want)
			}
		})
	}
	// The first key on record is how a run is found in the log (its index
	// entry is filed under it): lost or moved, the run is damage Runs
	// lists, by the run its entry names, and appends after its tail are
	// refused.
	for name, damage := range map[string]func(tx *bolt.Tx, envs []events.Envelope) error{
		"no first event on record": func(tx *bolt.Tx, envs []events.Envelope) error {
			return tx.Bucket(startsBucket).Delete([]byte("A"))
		},
		"the first event on record elsewhere": func(tx *bolt.Tx, envs []events.Envelope) error {
			return tx.Bucket(startsBucket).Put([]byte("A"), envs[1].ID[:])
		},
	} {
		t.Run(name, func(t *testing.T) {
			s, err := Open(filepath.Join(t.TempDir(), "s.db"), Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			envs, err := s.Append(ctx, "A", ulid.ULID{}, proptest.SoundStream("A")[:3]...)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.db.Update(func(tx *bolt.Tx) error { return damage(tx, envs) }); err != nil {
				t.Fatal(err)
			}
			if runs, err := s.Runs(ctx); err != nil || len(runs) != 1 || runs[0].RunID != "A" || runs[0].Status != StatusCorrupt {
				t.Fatalf("Runs: %+v, %v (want run A once, damaged)", runs, err)
			}
			if _, err := s.Append(ctx, "A", envs[2].ID, proptest.SoundStream("A")[3]); err == nil {
				t.Fatal("an append after the run's tail landed")
			}
		})
	}
}

// rewriteInfo changes run's index entry and seals it again, as a writer
// gone wrong would.
func rewriteInfo(tx *bolt.Tx, run string, change func(*RunInfo)) error {
	info, _, err := readInfo(tx.Bucket(indexBucket), entryOf(tx, run), run)
	if err != nil {
		return err
	}
	change(&info)
	_, err = writeInfo(tx.Bucket(indexBucket), entryOf(tx, run), info)
	return err
}

// entryOf is the key run's index entry is filed under in tx's store: its
// first key in the log, its run id in a bucket per run.
func entryOf(tx *bolt.Tx, run string) []byte {
	if tx.Bucket(logBucket) != nil {
		return logLayout{}.entryKey(tx, run)
	}
	return []byte(run)
}

// TestOpenResolvesThePageSize: a store Open creates has DefaultPageSize
// pages unless Options.PageSize names a power of two from 1 KiB to 64 KiB;
// anything else is refused, naming the value.
func TestOpenResolvesThePageSize(t *testing.T) {
	for _, c := range []struct{ set, want int }{
		{0, DefaultPageSize}, {1 << 10, 1 << 10}, {4096, 4096}, {64 << 10, 64 << 10},
		{512, 0}, {128 << 10, 0}, {3000, 0}, {-1, 0},
	} {
		t.Run(fmt.Sprint(c.set), func(t *testing.T) {
			s, err := Open(filepath.Join(t.TempDir(), "p.db"), Options{PageSize: c.set, NoSync: true})
			if c.want == 0 {
				if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("Options.PageSize %d is not a power of two", c.set)) {
					t.Fatalf("got %v, want a refusal naming %d", err, c.set)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if got := s.db.Info().PageSize; got != c.want {
				t.Errorf("page size %d, want %d", got, c.want)
			}
		})
	}
}
