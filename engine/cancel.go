package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
)

// Cancellation is what Cancel did.
type Cancellation struct {
	// Holder is the driver that holds the run (a store's owner name): it
	// sees the request before its next model call or side effect and ends
	// the run cancelled. Empty when Cancel ended the run itself.
	Holder string
	// Result is the run's result when Cancel ended it itself (stop reason
	// cancelled); nil when a holder will.
	Result *events.RunResult
	// InDoubt is the intent whose side effect's outcome the run's log left
	// unknown when Cancel ended it (its process died during the call);
	// cancelling settles nothing about it. Nil otherwise.
	InDoubt *events.Intent
}

// Cancel cancels the run runID from outside the process that drives it —
// what an operator does (`polyloop-admin cancel`) — through a store that
// keeps cancel requests (seams.RunCanceller: kv.Store, pgstore.Store). The
// request is durable first, recording by (an opaque name). A run a driver
// holds is ended by that driver, which sees the request before its next
// model call or side effect (Cancellation.Holder names it). A run nobody
// holds is ended here at once: Cancel takes it as a driver would
// (seams.RunLocker), checks its log and appends RunFinished{cancelled}
// after its last event; a side effect a crash left in doubt stays so
// (Cancellation.InDoubt). A queued run nobody holds is thereby taken out
// of the queue.
//
// Cancel fails with ErrRunNotFound for a run the store does not hold, with
// seams.ErrRunFinished for a finished one, and with an error matching
// recovery.ErrCorrupt for a damaged log, writing nothing but the request.
func Cancel(ctx context.Context, store seams.RunStore, runID, by string) (Cancellation, error) {
	if err := seams.ValidRunID(runID); err != nil {
		return Cancellation{}, fmt.Errorf("engine: cancel: %w", err)
	}
	c, ok := store.(seams.RunCanceller)
	if !ok {
		return Cancellation{}, fmt.Errorf("engine: cancel run %q: the store (%T) keeps no cancel requests", runID, store)
	}
	holder, err := c.RequestCancel(ctx, runID, by)
	switch {
	case errors.Is(err, seams.ErrNoRun):
		return Cancellation{}, fmt.Errorf("engine: cancel run %q: %w", runID, ErrRunNotFound)
	case err != nil:
		return Cancellation{}, fmt.Errorf("engine: cancel run %q: %w", runID, err)
	case holder != "":
		return Cancellation{Holder: holder}, nil
	}
	release, err := lockRun(store, runID)
	if errors.Is(err, ErrRunBusy) {
		// Taken since the request was recorded: its new holder reads the
		// request when it takes the run.
		return Cancellation{Holder: holderOf(ctx, store, runID)}, nil
	}
	if err != nil {
		return Cancellation{}, err
	}
	defer release()
	stream, err := store.Load(ctx, runID)
	verdict, err := recovery.ClassifyLoaded(runID, stream, err)
	switch {
	case err != nil:
		return Cancellation{}, fmt.Errorf("engine: cancel run %q: %w", runID, err)
	case len(stream) == 0:
		return Cancellation{}, fmt.Errorf("engine: cancel run %q: %w", runID, ErrRunNotFound)
	case verdict.State == recovery.Finished:
		return Cancellation{}, fmt.Errorf("engine: cancel run %q: %w", runID, seams.ErrRunFinished)
	}
	var fold recovery.Fold
	for _, env := range stream {
		fold.Apply(env.Event)
	}
	out := Cancellation{InDoubt: fold.InDoubt()}
	finished := events.RunFinished{RunID: runID, Result: events.RunResult{
		RunID: runID, StopReason: events.StopCancelled, SchemaVersion: events.CurrentSchemaVersion,
	}}
	if _, err := store.Append(ctx, runID, stream[len(stream)-1].ID, finished); err != nil {
		return Cancellation{}, fmt.Errorf("engine: cancel run %q: %w", runID, err)
	}
	fold.Apply(finished)
	result, _ := fold.Result()
	out.Result = &result
	return out, nil
}

// holderOf names runID's holder as the store describes it, or says that
// another driver took it.
func holderOf(ctx context.Context, store seams.RunStore, runID string) string {
	if d, ok := store.(seams.RunDescriber); ok {
		if info, err := d.Describe(ctx, runID); err == nil && info.Owner != "" {
			return info.Owner
		}
	}
	return "another driver"
}
