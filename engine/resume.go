package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
)

// Resume continues the run req.RunID from its log after a crash or an
// interruption. It fails with ErrRunNotFound when the run has no log. A
// finished run returns its recorded result and writes nothing. Otherwise the
// definition's and request's parameter snapshot must equal the one stored at
// the start (ErrParametersChanged lists every differing key); the log is
// replayed through the same machine Run uses, and the tail is handled by the
// recovery table: a model call or action whose outcome is unknown is made
// again with its original result id when its policy is safe, and the run
// stops with resume_state_unknown when it is never; a known model failure
// completes as llm_error; a stored reply is re-parsed without a model call.
func Resume(ctx context.Context, def Definition, req Request) (events.RunResult, error) {
	cfg, err := prepare(def, req)
	if err != nil {
		return events.RunResult{}, err
	}
	// A run with no log is not found before its id is held: a Resume
	// holding the id of a run that does not exist would turn a Run starting
	// it away for nothing.
	if found, err := hasLog(ctx, def.Store, req.RunID); err == nil && !found {
		return events.RunResult{}, fmt.Errorf("engine: resume %q: %w", req.RunID, ErrRunNotFound)
	}
	release, err := lockRun(def.Store, req.RunID)
	if err != nil {
		return events.RunResult{}, err
	}
	defer release()
	// The stream is replayed as it is read — one event at a time from a
	// store that can hand it over so (seams.RunScanner), so a long run is
	// never held whole beside the state it rebuilds. The machine's log
	// checks each event as it folds it (recovery.Classifier), and has the
	// last word once the whole stream was read.
	m := newMachine(cfg)
	var last ulid.ULID
	replay := func(env events.Envelope) error {
		m.step(input{kind: inReplayed, env: env})
		last = env.ID
		return nil
	}
	var loadErr error
	if sc, ok := def.Store.(seams.RunScanner); ok {
		loadErr = sc.Scan(ctx, req.RunID, replay)
	} else {
		var stream []events.Envelope
		stream, loadErr = def.Store.Load(ctx, req.RunID)
		for _, env := range stream {
			replay(env)
		}
	}
	verdict, err := m.log.Verdict(loadErr)
	switch {
	case errors.Is(err, recovery.ErrCorrupt):
		return events.RunResult{}, fmt.Errorf("engine: resume %q: %w", req.RunID, err)
	case err != nil:
		return events.RunResult{}, fmt.Errorf("engine: load run %q: %w", req.RunID, err)
	case m.log.Events() == 0:
		return events.RunResult{}, fmt.Errorf("engine: resume %q: %w", req.RunID, ErrRunNotFound)
	}
	if verdict.State == recovery.Finished {
		return *verdict.Result, nil
	}
	if len(m.diff) > 0 {
		return events.RunResult{}, fmt.Errorf("engine: resume %q: %w:\n  %s", req.RunID, ErrParametersChanged, strings.Join(m.diff, "\n  "))
	}
	return newDriver(def, req, last).drive(ctx, m)
}

// RunOrResume continues the run req.RunID when the store holds it and
// starts it otherwise: the one call of a program that may have been
// stopped, crashed or restarted before, and runs the same request again.
// It is Resume, then Run when Resume finds no log (ErrRunNotFound). So a
// finished run returns its recorded result, writing nothing, and every
// other error is Resume's or Run's, unchanged: ErrAwaitingDecision (an
// *AwaitingError), ErrParametersChanged, ErrRunBusy, recovery.ErrCorrupt,
// ErrInterrupted, ErrInvalidRequest. A run another driver started between
// the two is continued (Resume again) unless that driver holds it
// (ErrRunBusy).
//
// Run refuses a run id that has a log and Resume one that has none;
// RunOrResume takes either. Start only makes a run durable, for a worker
// (package worker) to drive: RunOrResume drives the run itself, in this
// process, until it stops, waits or is interrupted.
func RunOrResume(ctx context.Context, def Definition, req Request) (events.RunResult, error) {
	result, err := Resume(ctx, def, req)
	if !errors.Is(err, ErrRunNotFound) {
		return result, err
	}
	result, err = Run(ctx, def, req)
	if errors.Is(err, ErrRunExists) && !errors.Is(err, ErrRunBusy) {
		return Resume(ctx, def, req)
	}
	return result, err
}

// errFound stops hasLog's scan at the first event.
var errFound = errors.New("found")

// hasLog reports whether runID has anything stored: by asking the store
// when it can tell (seams.RunFinder), else reading only the first event
// when it can hand a stream over event by event, else loading it. An error
// means it cannot tell; the caller then reads the run as it would have.
func hasLog(ctx context.Context, store seams.RunStore, runID string) (bool, error) {
	if f, ok := store.(seams.RunFinder); ok {
		return f.HasRun(ctx, runID)
	}
	if sc, ok := store.(seams.RunScanner); ok {
		err := sc.Scan(ctx, runID, func(events.Envelope) error { return errFound })
		if errors.Is(err, errFound) {
			return true, nil
		}
		return false, err
	}
	stream, err := store.Load(ctx, runID)
	return len(stream) > 0, err
}
