package kv

import (
	"bytes"
	"context"
	"iter"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

var _ seams.RunTailer = (*Store)(nil)

// LoadAfter implements seams.RunTailer. It reads the run's index entry
// and only the events after the first seen: in the log it walks back from
// the entry's last key to last, checking each link and number on the way
// (and, when a step refers to a reply before them, reads back to that
// reply); in a bucket per run it seeks past last. Anything out of the
// way — an entry that fails its checksum, a chain that does not lead back
// to last, a value that does not decode — and it reads the whole stream
// as Load does, answering as Load answers (seams.StreamAfter).
func (s *Store) LoadAfter(ctx context.Context, runID string, seen int, last ulid.ULID) ([]events.Envelope, error) {
	return s.loadAfter(ctx, runID, seen, last, nil)
}

// loadAfter is LoadAfter; rec, when set, records what the stream reader
// is handed for a served read, which keeps none of the events it decodes
// and gives up once it copied more than a chunk's bytes: where LoadAfter
// would read the whole stream, it records only that (rec.whole), and the
// reader reads the whole stream in chunks (Remote.LoadAfter).
func (s *Store) loadAfter(ctx context.Context, runID string, seen int, last ulid.ULID, rec *recording) ([]events.Envelope, error) {
	whole := func() ([]events.Envelope, error) {
		if rec != nil {
			rec.reset(true)
			return nil, nil
		}
		stream, err := s.read(ctx, runID, nil)
		return seams.StreamAfter(runID, stream, err, seen, last)
	}
	if seen <= 0 {
		return whole()
	}
	if err := s.readable(ctx, runID); err != nil {
		return nil, rec.failed(err)
	}
	r := events.StreamReader{RunID: runID, Tee: rec.teeFunc()}
	if rec != nil {
		r.Each = rec.each(ctx)
	}
	read := false
	err := withFaultsAsPanics(func() error {
		return s.db.View(func(tx *bolt.Tx) error {
			index := tx.Bucket(indexBucket)
			if index == nil {
				return nil
			}
			info, indexed, err := readInfo(index, s.layout.entryKey(tx, runID), runID)
			if err == nil && indexed && seen <= info.Events {
				read = s.layout.readAfter(tx, runID, info, seen, last, &r)
			}
			return nil
		})
	})
	if out, rerr := r.Stream(); err == nil && read && rerr == nil {
		return out, nil
	}
	return whole()
}

func (l logLayout) readAfter(tx *bolt.Tx, _ string, info RunInfo, seen int, last ulid.ULID, r *events.StreamReader) bool {
	log := tx.Bucket(logBucket)
	if log == nil {
		return false
	}
	back := make([]chained, 0, info.Events-seen) // newest first
	key := info.LastID
	for len(back) < info.Events-seen {
		v := log.Get(key[:])
		if v == nil {
			return false
		}
		prev, seq, sealed, err := splitLog(key, v)
		if err != nil || seq != uint64(info.Events-1-len(back)) || prev.Compare(key) >= 0 {
			return false
		}
		back = append(back, chained{key, sealed})
		key = prev
	}
	if key != last {
		return false
	}
	r.Earlier = chainBack(log, last)
	for i := len(back) - 1; i >= 0 && !r.Stopped(); i-- {
		r.Value(back[i].key, back[i].sealed) // decoding copies what it keeps
	}
	return true
}

// chainBack yields the run's sealed values from key back, newest first,
// following the links; a value missing, or whose link fails its checksum
// or does not lead back, is yielded nil and ends it.
func chainBack(log *bolt.Bucket, key ulid.ULID) iter.Seq2[ulid.ULID, []byte] {
	return func(yield func(ulid.ULID, []byte) bool) {
		for key != (ulid.ULID{}) {
			v := log.Get(key[:])
			if v == nil {
				yield(key, nil)
				return
			}
			prev, _, sealed, err := splitLog(key, v)
			if err != nil || prev.Compare(key) >= 0 {
				yield(key, nil)
				return
			}
			if !yield(key, sealed) {
				return
			}
			key = prev
		}
	}
}

func (l bucketLayout) readAfter(tx *bolt.Tx, runID string, info RunInfo, seen int, last ulid.ULID, r *events.StreamReader) bool {
	b, err := l.stream(tx, runID)
	if err != nil || b == nil {
		return false
	}
	c := b.Cursor()
	if k, _ := c.Seek(last[:]); !bytes.Equal(k, last[:]) {
		return false
	}
	n, tail := seen, last
	for k, v := c.Next(); k != nil; k, v = c.Next() {
		if len(k) != len(tail) {
			return false
		}
		n, tail = n+1, ulid.ULID(k)
		r.Value(tail, v) // decoding copies what it keeps
	}
	return n == info.Events && (info.LastID == ulid.ULID{} || info.LastID == tail)
}
