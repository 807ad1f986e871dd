package kv

import (
	"context"
	"errors"
	"fmt"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

var _ seams.RunForker = (*Store)(nil)

// ForkRun implements seams.RunForker in one write transaction: the source's
// stream is read as Load reads it (a source whose stream or index entry is
// damaged is refused with ErrCorrupt), its values up to through are
// decoded, then written for runID after started, each the source's sealed
// value resealed under a key minted for runID as Append mints them, with
// runID's first-key record, index entry and, for a run started for an
// agent, queue entry. This process then knows the fork's latest reply as
// of its tail (the prefix's), so a step appended next may refer to it as
// after any append.
func (s *Store) ForkRun(ctx context.Context, runID string, started events.RunStarted, source string, through ulid.ULID, n int) ([]events.Envelope, error) {
	if s.readOnly {
		return nil, ErrReadOnly
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for _, id := range []string{runID, source} {
		if err := seams.ValidRunID(id); err != nil {
			return nil, fmt.Errorf("kv: fork: %w", err)
		}
	}
	switch {
	case len(runID) > bolt.MaxKeySize:
		return nil, fmt.Errorf("kv: fork: run id is %d bytes, longer than bbolt's %d-byte key limit", len(runID), bolt.MaxKeySize)
	case started.RunID != runID:
		return nil, fmt.Errorf("kv: fork %q: its run_started names run %q", runID, started.RunID)
	}
	if started.Agent != "" {
		if err := seams.ValidAgent(started.Agent); err != nil {
			return nil, fmt.Errorf("kv: fork %q: run_started: %w", runID, err)
		}
	}
	first, err := events.AppendMarshalAfter(make([]byte, logHeader, logHeader+256), started, nil)
	if err != nil {
		return nil, fmt.Errorf("kv: fork %q: %w", runID, err)
	}
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	var (
		envs  []events.Envelope
		reply = latestReply{known: true} // a new run's: none
		r     = &appendRequest{runID: runID, evs: []events.Event{started}}
	)
	err = withFaultsAsPanics(func() error {
		return s.db.Update(func(tx *bolt.Tx) error {
			index, queue := tx.Bucket(indexBucket), tx.Bucket(queueBucket)
			if index == nil || queue == nil {
				return fmt.Errorf("%w: %s: the index or the queue bucket is missing", ErrCorrupt, s.path)
			}
			if _, indexed, _ := readInfo(index, s.layout.entryKey(tx, runID), runID); indexed || s.layout.exists(tx, runID) {
				return fmt.Errorf("fork onto %q: %w", runID, seams.ErrRunExists)
			}
			if err := s.lost(tx, runID); err != nil {
				return fmt.Errorf("fork onto %q: %w: %w", runID, ErrCorrupt, err)
			}
			prefix, vals, err := s.prefix(tx, index, source, through, n)
			if err != nil {
				return err
			}
			info := RunInfo{RunID: runID, Status: StatusRunning}
			now := s.clock()
			var tail ulid.ULID
			envs = make([]events.Envelope, 0, 1+n)
			for i := 0; i <= n; i++ {
				v, env := first, events.Envelope{Kind: started.Kind(), SchemaVersion: events.CurrentSchemaVersion, Event: started}
				if i > 0 {
					v, env = append(make([]byte, logHeader, logHeader+len(vals[i])), vals[i]...), prefix[i]
				}
				if tail, err = s.putValue(tx, runID, uint64(info.Events), now, tail, v, events.Reseal); err != nil {
					return err
				}
				env.ID = tail
				info.Apply(env)
				reply = reply.after(env.Event)
				envs = append(envs, env)
			}
			// Queued for its agent, unless the prefix holds its source's
			// end: a finished run is queued for nobody.
			if err := s.enqueue(queue, r, false, info.Status == StatusFinished); err != nil {
				return fmt.Errorf("queue entry of run %q: %w", runID, err)
			}
			raw, err := writeInfo(index, s.layout.entryKey(tx, runID), info)
			if err != nil {
				return fmt.Errorf("index entry of run %q: %w", runID, err)
			}
			s.written.put(info, raw)
			return nil
		})
	})
	if err != nil {
		for i := len(r.undo) - 1; i >= 0; i-- {
			r.undo[i]()
		}
		return nil, fmt.Errorf("kv: fork %q from %q (nothing was written): %w", runID, source, err)
	}
	s.txCount.Add(1)
	last := envs[len(envs)-1]
	s.replies.set(runID, last.ID, reply, last.Kind == events.KindRunFinished)
	return envs, nil
}

// prefix reads source's stream in tx as Load does and returns its events
// up to through (its RunStarted alone for a zero through), decoded, and
// their sealed values: ErrForkPrefix unless through is a key of the stream
// with n events after RunStarted up to it, seams.ErrNoRun for a run the
// store does not hold, ErrCorrupt for one it cannot read whole.
func (s *Store) prefix(tx *bolt.Tx, index *bolt.Bucket, source string, through ulid.ULID, n int) ([]events.Envelope, [][]byte, error) {
	info, indexed, err := readInfo(index, s.layout.entryKey(tx, source), source)
	switch {
	case !indexed && !s.layout.exists(tx, source):
		if err := s.lost(tx, source); err != nil {
			return nil, nil, fmt.Errorf("fork from %q: %w: %w", source, ErrCorrupt, err)
		}
		return nil, nil, fmt.Errorf("fork from %q: %w", source, seams.ErrNoRun)
	case err != nil:
		return nil, nil, fmt.Errorf("fork from %q: %w", source, err)
	case !indexed:
		return nil, nil, fmt.Errorf("fork from %q: %w: it has a stream but no index entry", source, ErrCorrupt)
	}
	chain, problems, _ := s.layout.values(tx, source, info, true)
	switch {
	case len(chain) == 0:
		problems = append(problems, errors.New("the stream holds no event"))
	case len(chain) != info.Events:
		problems = append(problems, fmt.Errorf("the stream holds %d events, its index entry counts %d: events are missing or were added", len(chain), info.Events))
	case info.LastID != (ulid.ULID{}) && chain[len(chain)-1].key != info.LastID:
		problems = append(problems, fmt.Errorf("the stream's last event is %s, its index entry names %s: the tail is missing or was added", chain[len(chain)-1].key, info.LastID))
	}
	if len(problems) > 0 {
		return nil, nil, fmt.Errorf("fork from %q: %w: %w", source, ErrCorrupt, errors.Join(problems...))
	}
	copied := 0
	if through != (ulid.ULID{}) {
		copied = -1
		for i, c := range chain {
			if c.key == through {
				copied = i
				break
			}
		}
	}
	switch {
	case copied < 0:
		return nil, nil, fmt.Errorf("fork from %q: %s is not a key of its stream: %w", source, through, seams.ErrForkPrefix)
	case copied != n:
		return nil, nil, fmt.Errorf("fork from %q: %d events up to %s, want %d: %w", source, copied, through, n, seams.ErrForkPrefix)
	}
	r := events.StreamReader{RunID: source}
	vals := make([][]byte, 1+n)
	for i, c := range chain[:1+n] {
		r.Value(c.key, c.sealed) // decoding copies what it keeps
		vals[i] = c.sealed
	}
	prefix, err := r.Stream()
	if err != nil {
		return nil, nil, fmt.Errorf("fork from %q: %w: %w", source, ErrCorrupt, err)
	}
	return prefix, vals, nil
}
