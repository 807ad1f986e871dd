package seams

import (
	"context"
	"errors"
	"fmt"

	"github.com/polyloop/polyloop/events"
)

// RunStore persists run streams. Implementations: kv.Store (bbolt) and
// seamstest.MemStore. proptest.RunStoreContract checks any implementation.
//
// Append writes evs, in order, in one transaction, to runID's stream, and
// returns their envelopes once they are durable. It fails with ErrRunExists
// when evs starts with RunStarted and the stream is not empty (atomically:
// of two concurrent starts exactly one wins), with ErrRunNotStarted when the
// stream is empty and evs does not start with RunStarted, with ErrRunFinished
// when the stream already holds RunFinished, and with an error naming the
// problem for an event that fails Validate or names another run. A failed
// Append writes nothing.
//
// Load returns runID's whole stream in order; a run never written is an
// empty stream and no error. A store failure is always an error, never an
// empty stream. The returned slice belongs to the caller.
type RunStore interface {
	Append(ctx context.Context, runID string, evs ...events.Event) ([]events.Envelope, error)
	Load(ctx context.Context, runID string) ([]events.Envelope, error)
	Parameters() map[string]string
}

// Store contract errors. Implementations wrap them; test with errors.Is.
var (
	// ErrRunExists: a RunStarted was appended to a stream that has events.
	ErrRunExists = errors.New("seams: run exists")
	// ErrRunNotStarted: the first event appended to a stream was not RunStarted.
	ErrRunNotStarted = errors.New("seams: run not started: the first event must be run_started")
	// ErrRunFinished: an event was appended after RunFinished.
	ErrRunFinished = errors.New("seams: run finished: nothing may follow run_finished")
)

// CheckAppend applies the append rules of RunStore to a batch, given whether
// the stream already holds events (started) and whether its last event is
// RunFinished (finished). Stores call it before writing anything, so a
// refused batch leaves the stream as it was.
func CheckAppend(runID string, started, finished bool, evs []events.Event) error {
	if runID == "" {
		return errors.New("append: empty run id")
	}
	if len(evs) == 0 {
		return errors.New("append: no events")
	}
	for i, ev := range evs {
		if ev == nil {
			return fmt.Errorf("append: event %d is nil", i)
		}
		if got := events.RunIDOf(ev); got != runID {
			return fmt.Errorf("append: event %d (%s) belongs to run %q, not %q", i, ev.Kind(), got, runID)
		}
		if err := ev.Validate(); err != nil {
			return fmt.Errorf("append: event %d (%s): %w", i, ev.Kind(), err)
		}
		switch {
		case finished:
			return fmt.Errorf("append to %q: %w", runID, ErrRunFinished)
		case ev.Kind() == events.KindRunStarted && (started || i > 0):
			return fmt.Errorf("append to %q: %w", runID, ErrRunExists)
		case !started && i == 0 && ev.Kind() != events.KindRunStarted:
			return fmt.Errorf("append %s to %q: %w", ev.Kind(), runID, ErrRunNotStarted)
		}
		started = true
		finished = ev.Kind() == events.KindRunFinished
	}
	return nil
}
