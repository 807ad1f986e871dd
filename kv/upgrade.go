package kv

import (
	"bytes"
	"container/heap"
	"errors"
	"fmt"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"
)

// upgrade copies a format 1 store (src, a bucket per run) into dst as a
// format 2 store (one log): every event's sealed value byte-identical under
// the same key, behind its link header. Index entries keep their fields,
// filed under the run's first key as the log files them (and sealed for
// it); an entry from before the store kept a run's last key and count
// (schema 1.0), which the log needs to find the run, gets them from the
// stream. A damaged entry is filed as it is, damage Load will report.
// Queue entries, filed by run id in both formats, are copied as they are. The runs'
// streams are merged in key order, so the log fills its pages as appends
// do; dst commits every upgradeBatch bytes. It keeps a cursor per run
// open while merging (memory grows with the number of runs, not events).
// A store that cannot be one log — a value where a stream should be, a key
// that is not a ULID, a key two runs share, an index entry of a run with
// no stream — is refused, and dst left for the caller to discard.
func upgrade(dst, src *bolt.DB) error {
	if err := dst.Update(func(tx *bolt.Tx) error { return makeFormat(tx, formatLog) }); err != nil {
		return err
	}
	return src.View(func(stx *bolt.Tx) error {
		runs, index := stx.Bucket(runsBucket), stx.Bucket(indexBucket)
		if runs == nil || index == nil {
			return fmt.Errorf("%w: one of the runs and index buckets is missing", ErrCorrupt)
		}
		w := &batchWriter{db: dst}
		var streams streamHeap
		if err := runs.ForEach(func(name, v []byte) error {
			b := runs.Bucket(name)
			if b == nil {
				return fmt.Errorf("%w: run %q: the runs bucket holds a value, not a stream, under its id", ErrCorrupt, name)
			}
			st := &stream{run: bytes.Clone(name), c: b.Cursor()}
			if st.k, st.v = st.c.First(); st.k != nil {
				streams = append(streams, st)
			}
			return nil
		}); err != nil {
			return err
		}
		heap.Init(&streams)
		tails := map[string]runTail{}
		var last ulid.ULID
		for len(streams) > 0 {
			st := streams[0]
			if len(st.k) != len(last) {
				return fmt.Errorf("%w: run %q: key %x is not a ULID", ErrCorrupt, st.run, st.k)
			}
			key := ulid.ULID(st.k)
			if key == last {
				return fmt.Errorf("%w: key %s is in two runs' streams (%q among them): the store cannot be one log", ErrCorrupt, key, st.run)
			}
			if st.seq == 0 {
				if err := w.put(startsBucket, st.run, key[:]); err != nil {
					return err
				}
			}
			v := make([]byte, logHeader+len(st.v))
			link(v, key, st.prev, st.seq)
			copy(v[logHeader:], st.v)
			if err := w.put(logBucket, key[:], v); err != nil {
				return err
			}
			last, st.prev, st.seq = key, key, st.seq+1
			if st.seq == 1 {
				st.first = key
			}
			if st.k, st.v = st.c.Next(); st.k == nil {
				tails[string(st.run)] = runTail{st.first, st.prev, st.seq}
				heap.Pop(&streams)
			} else {
				heap.Fix(&streams, 0)
			}
		}
		err := index.ForEach(func(k, v []byte) error {
			tail, ok := tails[string(k)]
			if !ok {
				return fmt.Errorf("%w: run %q has an index entry and no stream: the store cannot be one log (delete the run first)", ErrCorrupt, k)
			}
			info, err := decodeInfo(k, v, string(k))
			if err != nil {
				return w.put(indexBucket, tail.first[:], v) // damage, filed where Load looks
			}
			if info.LastID == (ulid.ULID{}) {
				info.LastID, info.Events = tail.last, int(tail.events)
			}
			if v, err = encodeInfo(tail.first[:], info); err != nil {
				return err
			}
			return w.put(indexBucket, tail.first[:], v)
		})
		if err != nil {
			return err
		}
		// Queue entries are filed by run id in both formats: copied as
		// they are (a damaged one stays damaged; the claims in them are of
		// Opens that have ended).
		if queue := stx.Bucket(queueBucket); queue != nil {
			if err := queue.ForEach(func(k, v []byte) error { return w.put(queueBucket, k, v) }); err != nil {
				return err
			}
		}
		return w.flush()
	})
}

// runTail is a run's first and last keys and event count, as the merge
// found them.
type runTail struct {
	first, last ulid.ULID
	events      uint64
}

// stream is one run's bucket being merged into the log.
type stream struct {
	run   []byte
	c     *bolt.Cursor
	k, v  []byte
	first ulid.ULID
	prev  ulid.ULID
	seq   uint64
}

// streamHeap orders streams by their next key.
type streamHeap []*stream

func (h streamHeap) Len() int           { return len(h) }
func (h streamHeap) Less(i, j int) bool { return bytes.Compare(h[i].k, h[j].k) < 0 }
func (h streamHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *streamHeap) Push(x any)        { *h = append(*h, x.(*stream)) }
func (h *streamHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// upgradeBatch bounds the bytes one transaction of an upgrade writes.
const upgradeBatch = 32 << 20

// batchWriter puts into dst in transactions of up to upgradeBatch bytes.
type batchWriter struct {
	db      *bolt.DB
	pending []kvPut
	size    int
}

type kvPut struct{ bucket, k, v []byte }

func (w *batchWriter) put(bucket, k, v []byte) error {
	w.pending = append(w.pending, kvPut{bucket, bytes.Clone(k), bytes.Clone(v)})
	if w.size += len(k) + len(v); w.size >= upgradeBatch {
		return w.flush()
	}
	return nil
}

func (w *batchWriter) flush() error {
	err := w.db.Update(func(tx *bolt.Tx) error {
		for _, p := range w.pending {
			b := tx.Bucket(p.bucket)
			if b == nil {
				return errors.New("kv: upgrade: a bucket of the new store is missing")
			}
			if bytes.Equal(p.bucket, logBucket) {
				// The log's keys arrive in order. starts is keyed by run id,
				// so its keys come in no order, and the index's entries are
				// rewritten in place as their runs go on: both keep bbolt's
				// fill.
				b.FillPercent = streamFillPercent
			}
			if err := b.Put(p.k, p.v); err != nil {
				return err
			}
		}
		return nil
	})
	w.pending, w.size = w.pending[:0], 0
	return err
}
