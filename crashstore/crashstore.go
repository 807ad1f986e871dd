// Package crashstore makes a run store crash on purpose: Store passes a
// number of appends to the store it wraps, then fails every later one
// with ErrCrashed, writing nothing, as if the process had died just before
// that write — pebble's errorfs pattern of failing the n-th operation.
// What the inner store holds afterwards is exactly what a crash at that
// point leaves durable, so a program can show a run resumed after a crash
// (the examples' -crash-after flag) and a test can crash a run at every
// write (proptest.CrashingStore is this Store).
//
// What does not live here: the stores themselves (kv, pgstore) and the
// resume that follows a crash (package engine).
package crashstore

import (
	"context"
	"errors"
	"sync"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// ErrCrashed is what a Store returns once it has crashed.
var ErrCrashed = errors.New("crashstore: store crashed")

// Store wraps a RunStore and crashes after a number of successful appends:
// the append that would exceed the limit, and every later one, writes
// nothing and fails with ErrCrashed. Load keeps working, so a test can
// Resume on the inner store and see exactly what was durable.
type Store struct {
	Inner seams.RunStore
	// After is how many appends succeed; a negative value never crashes.
	After int

	mu      sync.Mutex
	appends int
}

var (
	_ seams.RunStore  = (*Store)(nil)
	_ seams.RunLeaser = (*Store)(nil)
)

// Append implements seams.RunStore.
func (s *Store) Append(ctx context.Context, runID string, after ulid.ULID, evs ...events.Event) ([]events.Envelope, error) {
	s.mu.Lock()
	if s.After >= 0 && s.appends >= s.After {
		s.mu.Unlock()
		return nil, ErrCrashed
	}
	s.appends++
	s.mu.Unlock()
	return s.Inner.Append(ctx, runID, after, evs...)
}

// LockRun implements seams.RunLocker with the inner store's locks, if it
// has any, so a crashing run holds its run like the real one would.
func (s *Store) LockRun(runID string) (func(), error) {
	if l, ok := s.Inner.(seams.RunLocker); ok {
		return l.LockRun(runID)
	}
	return func() {}, nil
}

// HoldsRun implements seams.RunLeaser with the inner store's leases, if
// it has any (nil otherwise: a lock that cannot be lost is still held).
func (s *Store) HoldsRun(ctx context.Context, runID string) error {
	if l, ok := s.Inner.(seams.RunLeaser); ok {
		return l.HoldsRun(ctx, runID)
	}
	return nil
}

// Load implements seams.RunStore.
func (s *Store) Load(ctx context.Context, runID string) ([]events.Envelope, error) {
	return s.Inner.Load(ctx, runID)
}

// Parameters implements seams.RunStore: the inner store's, so a run begun
// on a Store resumes on its inner store with the same snapshot.
func (s *Store) Parameters() map[string]string { return s.Inner.Parameters() }
