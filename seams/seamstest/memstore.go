package seamstest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

var _ seams.RunStore = (*MemStore)(nil)

// MemStore is an in-memory seams.RunStore that keeps the same append rules
// as kv.Store (it passes proptest.RunStoreContract). Events are encoded and
// decoded on the way in and out, so a test against it also exercises the
// codec. Safe for concurrent use; the zero value is ready.
type MemStore struct {
	seams.RunLocks // one driver per run, in this process

	mu      sync.Mutex
	streams map[string][]stored
	ids     events.IDSource
	appends int
	queue   map[string]*queued // runs started for an agent, or asked to cancel
}

// NewMemStore returns an empty MemStore.
func NewMemStore() *MemStore { return &MemStore{} }

type stored struct {
	env events.Envelope
	val []byte
}

// Append implements seams.RunStore.
func (m *MemStore) Append(ctx context.Context, runID string, after ulid.ULID, evs ...events.Event) ([]events.Envelope, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := seams.ValidRunID(runID); err != nil {
		return nil, err
	}
	vals := make([][]byte, len(evs))
	for i, ev := range evs {
		b, err := events.Marshal(ev)
		if err != nil {
			return nil, err
		}
		vals[i] = b
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	stream := m.streams[runID]
	var tail ulid.ULID
	finished := false
	if len(stream) > 0 {
		last := stream[len(stream)-1].env
		tail, finished = last.ID, last.Kind == events.KindRunFinished
	}
	if err := seams.CheckAppend(runID, tail, finished, after, evs); err != nil {
		return nil, err
	}
	if m.streams == nil {
		m.streams = map[string][]stored{}
	}
	now := time.Now()
	envs := make([]events.Envelope, len(evs))
	for i, ev := range evs {
		tail = m.ids.NextAfter(now, tail)
		if err := events.Seal(vals[i], runID, tail); err != nil {
			return nil, err
		}
		envs[i] = events.Envelope{ID: tail, Kind: ev.Kind(), SchemaVersion: events.CurrentSchemaVersion, Event: ev}
		stream = append(stream, stored{env: envs[i], val: vals[i]})
	}
	m.streams[runID] = stream
	m.noteQueue(runID, evs)
	m.appends++
	return envs, nil
}

// Load implements seams.RunStore.
func (m *MemStore) Load(ctx context.Context, runID string) ([]events.Envelope, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := seams.ValidRunID(runID); err != nil {
		return nil, err
	}
	m.mu.Lock()
	stream := m.streams[runID]
	m.mu.Unlock()
	r := events.StreamReader{RunID: runID}
	for _, s := range stream {
		r.Value(s.env.ID, s.val)
	}
	return r.Stream()
}

// Damage replaces the value stored for runID's i-th event (from 0) with
// what change makes of a copy of it, behind the store's back, as a disk
// would: for tests of what readers make of damage. It reports whether the
// run holds an i-th event.
func (m *MemStore) Damage(runID string, i int, change func(value []byte) []byte) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	stream := m.streams[runID]
	if i < 0 || i >= len(stream) {
		return false
	}
	stream = slices.Clone(stream) // a Load may be reading the old one
	stream[i].val = change(slices.Clone(stream[i].val))
	m.streams[runID] = stream
	return true
}

// Transactions is the number of successful Append calls.
func (m *MemStore) Transactions() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return uint64(m.appends)
}

// Parameters implements seams.RunStore.
func (m *MemStore) Parameters() map[string]string {
	return map[string]string{"kind": "memory", "schema_version": events.CurrentSchemaVersion}
}

// Runs implements seams.RunReader: every run, ordered by run id, folded
// from its stream.
func (m *MemStore) Runs(ctx context.Context) ([]seams.RunInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]seams.RunInfo, 0, len(m.streams))
	for id := range m.streams {
		out = append(out, m.describe(id))
	}
	slices.SortFunc(out, func(a, b seams.RunInfo) int { return strings.Compare(a.RunID, b.RunID) })
	return out, nil
}

// DeleteRun implements seams.RunDeleter.
func (m *MemStore) DeleteRun(ctx context.Context, runID string, force bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	release, err := m.LockRun(runID)
	if err != nil {
		return err
	}
	defer release()
	m.mu.Lock()
	defer m.mu.Unlock()
	stream, ok := m.streams[runID]
	switch {
	case !ok || len(stream) == 0:
		return seams.ErrNoRun
	case !force && stream[len(stream)-1].env.Kind != events.KindRunFinished:
		return seams.ErrRunNotFinished
	}
	delete(m.streams, runID)
	delete(m.queue, runID)
	return nil
}

// ForkRun implements seams.RunForker.
func (m *MemStore) ForkRun(ctx context.Context, runID string, started events.RunStarted, source string, through ulid.ULID, n int) ([]events.Envelope, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for _, id := range []string{runID, source} {
		if err := seams.ValidRunID(id); err != nil {
			return nil, err
		}
	}
	if started.RunID != runID {
		return nil, fmt.Errorf("memstore: fork %q: its run_started names run %q", runID, started.RunID)
	}
	val, err := events.Marshal(started)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.streams[runID]) > 0 {
		return nil, fmt.Errorf("memstore: fork %q: %w", runID, seams.ErrRunExists)
	}
	src := m.streams[source]
	if len(src) == 0 {
		return nil, fmt.Errorf("memstore: fork %q from %q: %w", runID, source, seams.ErrNoRun)
	}
	copied := 0
	if through != (ulid.ULID{}) {
		copied = slices.IndexFunc(src, func(s stored) bool { return s.env.ID == through })
	}
	if copied < 0 || copied != n {
		return nil, fmt.Errorf("memstore: fork %q from %q: %d events up to %s, want %d: %w", runID, source, copied, through, n, seams.ErrForkPrefix)
	}
	if m.streams == nil {
		m.streams = map[string][]stored{}
	}
	now, tail := time.Now(), ulid.ULID{}
	out := make([]stored, 0, 1+n)
	evs := make([]events.Event, 0, 1+n)
	for i, s := range append([]stored{{env: events.Envelope{Kind: started.Kind(), SchemaVersion: events.CurrentSchemaVersion, Event: started}, val: val}}, src[1:1+n]...) {
		tail = m.ids.NextAfter(now, tail)
		v := s.val
		if i > 0 {
			v = slices.Clone(v)
		}
		if err := events.Reseal(v, runID, tail); err != nil {
			return nil, err
		}
		env := s.env
		env.ID = tail
		out = append(out, stored{env: env, val: v})
		evs = append(evs, env.Event)
	}
	m.streams[runID] = out
	m.noteQueue(runID, evs) // a fork that copied its source's end is queued for nobody
	m.appends++
	envs := make([]events.Envelope, len(out))
	for i, s := range out {
		envs[i] = s.env
	}
	return envs, nil
}
