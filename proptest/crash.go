package proptest

import (
	"context"
	"errors"
	"sync"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// ErrCrashed is what a CrashingStore returns once it has "crashed".
var ErrCrashed = errors.New("proptest: store crashed")

// CrashingStore wraps a RunStore and crashes after a number of successful
// appends: the append that would exceed the limit, and every later one,
// writes nothing and fails with ErrCrashed, as if the process had died just
// before that write. Load keeps working, so a test can Resume on the inner
// store and see exactly what was durable. Like pebble's errorfs, it fails
// the n-th operation.
type CrashingStore struct {
	Inner seams.RunStore
	// After is how many appends succeed; a negative value never crashes.
	After int

	mu      sync.Mutex
	appends int
}

// Append implements seams.RunStore.
func (c *CrashingStore) Append(ctx context.Context, runID string, after ulid.ULID, evs ...events.Event) ([]events.Envelope, error) {
	c.mu.Lock()
	if c.After >= 0 && c.appends >= c.After {
		c.mu.Unlock()
		return nil, ErrCrashed
	}
	c.appends++
	c.mu.Unlock()
	return c.Inner.Append(ctx, runID, after, evs...)
}

// LockRun implements seams.RunLocker with the inner store's locks, if it
// has any, so a crashing run holds its run like the real one would.
func (c *CrashingStore) LockRun(runID string) (func(), error) {
	if l, ok := c.Inner.(seams.RunLocker); ok {
		return l.LockRun(runID)
	}
	return func() {}, nil
}

// Load implements seams.RunStore.
func (c *CrashingStore) Load(ctx context.Context, runID string) ([]events.Envelope, error) {
	return c.Inner.Load(ctx, runID)
}

// Parameters implements seams.RunStore: the inner store's, so a run begun
// on a CrashingStore resumes on its inner store with the same snapshot.
func (c *CrashingStore) Parameters() map[string]string { return c.Inner.Parameters() }

// Appends is the number of appends passed to the inner store (whether it
// accepted them or not).
func (c *CrashingStore) Appends() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.appends
}
