package seamstest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// MemOwner is the holder a MemStore names: a MemStore's holds last as
// long as the process.
const MemOwner = "memstore"

// queued is a MemStore's queue entry for a run: started for an agent, or
// with a cancel request. claimed: the store claimed the run and no driver
// has taken it yet (LockRun ends the claim).
type queued struct {
	agent     string
	claimed   bool
	failures  int
	lastError string
	retryAt   time.Time
	cancel    *seams.CancelRequest
}

var (
	_ seams.RunQueue     = (*MemStore)(nil)
	_ seams.RunCanceller = (*MemStore)(nil)
	_ seams.RunDescriber = (*MemStore)(nil)
)

// noteQueue keeps the queue beside an append: a run started for an agent
// joins it, a finished run leaves it. m.mu is held.
func (m *MemStore) noteQueue(runID string, evs []events.Event) {
	for _, ev := range evs {
		if s, ok := events.As[events.RunStarted](ev); ok && s.Agent != "" {
			if m.queue == nil {
				m.queue = map[string]*queued{}
			}
			m.queue[runID] = &queued{agent: s.Agent}
		}
		if ev.Kind() == events.KindRunFinished {
			delete(m.queue, runID)
		}
	}
}

// ClaimRuns implements seams.RunQueue, in run id order. An agent name
// seams.ValidAgent refuses is an error.
func (m *MemStore) ClaimRuns(ctx context.Context, agents []string, max int) ([]seams.Claim, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(agents) == 0 || max < 1 {
		return nil, nil
	}
	for _, a := range agents {
		if err := seams.ValidAgent(a); err != nil {
			return nil, fmt.Errorf("memstore: claim runs: %w", err)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	var out []seams.Claim
	for _, id := range slices.Sorted(maps.Keys(m.queue)) {
		if len(out) >= max {
			break
		}
		q := m.queue[id]
		if q.agent == "" || !slices.Contains(agents, q.agent) || q.claimed || m.Held(id) || now.Before(q.retryAt) {
			continue
		}
		q.claimed = true
		out = append(out, seams.Claim{RunID: id, Agent: q.agent})
	}
	return out, nil
}

// LockRun implements seams.RunLocker (seams.RunLocks): it succeeds for a
// run this store claimed, and ends the claim, so nobody holds the run
// once its driver lets go.
func (m *MemStore) LockRun(runID string) (func(), error) {
	release, err := m.RunLocks.LockRun(runID)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	if q := m.queue[runID]; q != nil {
		q.claimed = false
	}
	m.mu.Unlock()
	return release, nil
}

// holds reports whether this store holds runID: a driver has it, or it was
// claimed and no driver has taken it yet. m.mu is held.
func (m *MemStore) holds(runID string) bool {
	q := m.queue[runID]
	return m.Held(runID) || q != nil && q.claimed
}

// ReleaseRun implements seams.RunQueue. A negative retry is an error.
func (m *MemStore) ReleaseRun(ctx context.Context, runID, failure string, retry time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if retry < 0 {
		return fmt.Errorf("memstore: release run %q: the retry wait %v is negative (want 0 or more)", runID, retry)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	q := m.queue[runID]
	if q == nil || q.agent == "" || m.Held(runID) {
		return nil
	}
	q.claimed, q.retryAt = false, time.Time{}
	if failure != "" {
		q.failures++
		q.lastError = failure
	}
	if failure != "" || retry > 0 {
		q.retryAt = time.Now().Add(retry)
	}
	return nil
}

// RequeueRun implements seams.RunQueue.
func (m *MemStore) RequeueRun(ctx context.Context, runID string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.unfinished(runID); err != nil {
		return fmt.Errorf("requeue: %w", err)
	}
	q := m.queue[runID]
	switch {
	case q == nil || q.agent == "":
		return fmt.Errorf("requeue run %q: %w", runID, seams.ErrNotQueued)
	case m.holds(runID):
		return fmt.Errorf("requeue run %q: %w (%s)", runID, seams.ErrRunLocked, MemOwner)
	}
	*q = queued{agent: q.agent, cancel: q.cancel}
	return nil
}

// unfinished refuses a run the store does not hold or that finished.
// m.mu is held.
func (m *MemStore) unfinished(runID string) error {
	stream := m.streams[runID]
	switch {
	case len(stream) == 0:
		return fmt.Errorf("run %q: %w", runID, seams.ErrNoRun)
	case stream[len(stream)-1].env.Kind == events.KindRunFinished:
		return fmt.Errorf("run %q: %w", runID, seams.ErrRunFinished)
	}
	return nil
}

// RequestCancel implements seams.RunCanceller.
func (m *MemStore) RequestCancel(ctx context.Context, runID, by string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.unfinished(runID); err != nil {
		return "", fmt.Errorf("request cancel: %w", err)
	}
	if m.queue == nil {
		m.queue = map[string]*queued{}
	}
	q := m.queue[runID]
	if q == nil {
		q = &queued{}
		m.queue[runID] = q
	}
	if q.cancel == nil {
		q.cancel = &seams.CancelRequest{By: by, At: time.Now()}
	}
	if m.holds(runID) {
		return MemOwner, nil
	}
	return "", nil
}

// CancelRequested implements seams.RunCanceller.
func (m *MemStore) CancelRequested(ctx context.Context, runID string) (*seams.CancelRequest, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if q := m.queue[runID]; q != nil && q.cancel != nil {
		r := *q.cancel
		return &r, nil
	}
	return nil, nil
}

// Describe implements seams.RunDescriber.
func (m *MemStore) Describe(ctx context.Context, runID string) (seams.RunInfo, error) {
	if err := ctx.Err(); err != nil {
		return seams.RunInfo{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.streams[runID]) == 0 {
		return seams.RunInfo{}, fmt.Errorf("run %q: %w", runID, seams.ErrNoRun)
	}
	return m.describe(runID), nil
}

// describe is runID's entry with its liveness. m.mu is held.
func (m *MemStore) describe(runID string) seams.RunInfo {
	info := seams.RunInfo{RunID: runID}
	for _, st := range m.streams[runID] {
		info.Apply(st.env)
	}
	if q := m.queue[runID]; q != nil {
		info.Agent, info.Failures, info.LastError, info.RetryAt = q.agent, q.failures, q.lastError, q.retryAt
		if q.cancel != nil {
			r := *q.cancel
			info.CancelRequested = &r
		}
	}
	if m.holds(runID) {
		info.Owner = MemOwner
	}
	info.Liveness(time.Now())
	return info
}

// EntryDamaged is a MemStore whose runs' index entries all fail their
// checksum, as kv and pgstore report such an entry: Describe and Load
// report the damage (Load with the events that decoded), for tests of
// what readers make of it.
type EntryDamaged struct{ *MemStore }

// entryDamage is the damage EntryDamaged reports for runID.
func entryDamage(runID string) error {
	return &events.DamageError{RunID: runID, Problems: []error{errors.New("its index entry fails its checksum")}}
}

// Describe implements seams.RunDescriber: always the entry's damage.
func (s EntryDamaged) Describe(ctx context.Context, runID string) (seams.RunInfo, error) {
	return seams.RunInfo{}, entryDamage(runID)
}

// Load implements seams.RunStore: the stream, and the entry's damage.
func (s EntryDamaged) Load(ctx context.Context, runID string) ([]events.Envelope, error) {
	stream, _ := s.MemStore.Load(ctx, runID)
	return stream, entryDamage(runID)
}
