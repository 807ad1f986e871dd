package kv

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/oklog/ulid/v2"
	"github.com/vmihailenco/msgpack/v5"
	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// Load implements seams.RunStore. Every value's checksum is verified, and
// the stream is checked against its index entry (the run exists in both or
// neither; as many events as the entry counts; the last key it names).
// When anything is wrong Load returns the events that did decode together
// with an error wrapping ErrCorrupt and an *events.DamageError listing
// every problem.
func (s *Store) Load(ctx context.Context, runID string) ([]events.Envelope, error) {
	return s.read(ctx, runID, nil)
}

var _ seams.RunScanner = (*Store)(nil)

// Scan implements seams.RunScanner: Load's reading and checks, handing the
// events to fn one at a time and keeping none, inside one read transaction
// (fn should not wait on this store's writers: a writer that must grow the
// file waits for the read to end).
func (s *Store) Scan(ctx context.Context, runID string, fn func(events.Envelope) error) error {
	_, err := s.read(ctx, runID, fn)
	return err
}

// readable is why runID cannot be read now, or nil: ctx ended, an id no
// store keeps, the store closed.
func (s *Store) readable(ctx context.Context, runID string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := seams.ValidRunID(runID); err != nil {
		return fmt.Errorf("kv: load: %w", err)
	}
	return s.checkOpen()
}

// read is Load, or with each set Scan.
func (s *Store) read(ctx context.Context, runID string, each func(events.Envelope) error) ([]events.Envelope, error) {
	if err := s.readable(ctx, runID); err != nil {
		return nil, err
	}
	r := events.StreamReader{RunID: runID, Each: each}
	if _, err := s.readStream(runID, &r, nil); err != nil {
		return nil, fmt.Errorf("kv: load run %q: %w", runID, err)
	}
	return loaded(runID, &r)
}

// streamSink is what a layout hands a run's stored stream to, in order:
// an events.StreamReader, or a served read's chunk (servedChunk), which
// copies the values without decoding them.
type streamSink interface {
	Value(id ulid.ULID, sealed []byte) (events.Envelope, bool)
	Problem(err error)
	Stopped() bool
}

// readStream hands runID's stored stream to sink in one read transaction,
// then what is wrong with it against its index entry, unless sink stopped
// first (it needs no more of the stream). pin, when set, is the index
// entry an earlier transaction read (a served read in chunks): the stream
// is read as of then, and a run that no longer reaches that far fails with
// seams.ErrStreamChanged. It returns the sound index entry it read by, or
// nil when there was none.
func (s *Store) readStream(runID string, sink streamSink, pin *RunInfo) (*RunInfo, error) {
	var by *RunInfo
	err := withFaultsAsPanics(func() error {
		return s.db.View(func(tx *bolt.Tx) error {
			index := tx.Bucket(indexBucket)
			if index == nil {
				return fmt.Errorf("%w: %s: the index bucket is missing", ErrCorrupt, s.path)
			}
			info, indexed, err := readInfo(index, s.layout.entryKey(tx, runID), runID)
			if pin != nil {
				if !indexed || err != nil || info.Events < pin.Events {
					return fmt.Errorf("%w: its stream changed while it was read in parts", seams.ErrStreamChanged)
				}
				info.Events, info.LastID = pin.Events, pin.LastID
			}
			if err != nil {
				sink.Problem(err)
			} else if indexed {
				by = &info
			}
			n, last, exists := s.layout.read(tx, runID, info, indexed && err == nil, sink)
			switch {
			case sink.Stopped():
				return nil
			case !exists && indexed:
				sink.Problem(fmt.Errorf("the index lists run %q but its stream is missing", runID))
				return nil
			case !exists:
				if err := s.lost(tx, runID); err != nil {
					sink.Problem(err)
				}
				return nil // never written, unless its id's key is damaged
			case !indexed:
				sink.Problem(fmt.Errorf("run %q has a stream but no index entry", runID))
			}
			if indexed && err == nil {
				if n != info.Events {
					sink.Problem(fmt.Errorf("the stream holds %d events, its index entry counts %d: events are missing or were added", n, info.Events))
				}
				if info.LastID != (ulid.ULID{}) && last != info.LastID {
					sink.Problem(fmt.Errorf("the stream's last event is %s, its index entry names %s: the tail is missing or was added", last, info.LastID))
				}
			}
			return nil
		})
	})
	return by, err
}

// loaded is what Load returns once r was handed runID's stream.
func loaded(runID string, r *events.StreamReader) ([]events.Envelope, error) {
	out, err := r.Stream()
	switch {
	case r.Stopped():
		return nil, err // fn's own error, as it returned it
	case err != nil:
		return out, fmt.Errorf("kv: load run %q: %w: %w", runID, ErrCorrupt, err)
	}
	return out, nil
}

// Runs lists every run in the index, ordered by run id, each with its
// queue entry, hold and liveness (coordinate). An entry that is damaged,
// and a stream whose entry is missing, are listed with StatusCorrupt.
func (s *Store) Runs(ctx context.Context) ([]RunInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	var (
		out     []RunInfo
		entries map[string]queueRead
	)
	err := withFaultsAsPanics(func() error {
		return s.db.View(func(tx *bolt.Tx) error {
			var err error
			if entries, err = queueEntries(tx); err != nil {
				return err
			}
			index := tx.Bucket(indexBucket)
			if index == nil {
				return fmt.Errorf("%w: %s: the index bucket is missing", ErrCorrupt, s.path)
			}
			if err := s.layout.entries(tx, func(k, v []byte, runID string) error {
				if runID == "" {
					// No run's first key names it: list it by the run it names, damaged.
					var st storedInfo
					_ = msgpack.Unmarshal(v, &st)
					out = append(out, RunInfo{RunID: cmp.Or(st.RunID, fmt.Sprintf("(index entry %x)", k)), Status: StatusCorrupt})
					return nil
				}
				info, err := decodeInfo(k, v, runID)
				if err != nil {
					info = RunInfo{RunID: runID, Status: StatusCorrupt}
				}
				out = append(out, info)
				return nil
			}); err != nil {
				return err
			}
			// A stream whose index entry is lost is listed too, damaged, once:
			// an entry no first key names is already listed by its run.
			orphans, err := s.layout.orphans(tx, index)
			if len(orphans) > 0 {
				listed := make(map[string]bool, len(out))
				for _, info := range out {
					listed[info.RunID] = true
				}
				for _, id := range orphans {
					if !listed[id] {
						out = append(out, RunInfo{RunID: id, Status: StatusCorrupt})
					}
				}
			}
			slices.SortFunc(out, func(a, b RunInfo) int { return strings.Compare(a.RunID, b.RunID) })
			return err
		})
	})
	if err != nil {
		return nil, fmt.Errorf("kv: list runs: %w", err)
	}
	now := s.clock()
	for i := range out {
		if e, ok := entries[out[i].RunID]; ok {
			s.coordinate(&out[i], &e.q, e.err, now)
		} else {
			s.coordinate(&out[i], nil, nil, now)
		}
	}
	return out, nil
}

// DataSize is the bytes the store's pages occupy up to its high-water mark
// (free pages inside it included). The file itself is larger: bbolt grows
// it ahead of need, doubling up to 1 GiB.
func (s *Store) DataSize() (int64, error) {
	if err := s.checkOpen(); err != nil {
		return 0, err
	}
	var n int64
	err := withFaultsAsPanics(func() error {
		return s.db.View(func(tx *bolt.Tx) error { n = tx.Size(); return nil })
	})
	return n, err
}
