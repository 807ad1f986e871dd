package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/recovery"
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
	release, err := lockRun(def.Store, req.RunID)
	if err != nil {
		return events.RunResult{}, err
	}
	defer release()
	stream, err := def.Store.Load(ctx, req.RunID)
	verdict, err := recovery.ClassifyLoaded(req.RunID, stream, err)
	switch {
	case errors.Is(err, recovery.ErrCorrupt):
		return events.RunResult{}, fmt.Errorf("engine: resume %q: %w", req.RunID, err)
	case err != nil:
		return events.RunResult{}, fmt.Errorf("engine: load run %q: %w", req.RunID, err)
	case len(stream) == 0:
		return events.RunResult{}, fmt.Errorf("engine: resume %q: %w", req.RunID, ErrRunNotFound)
	}
	if verdict.State == recovery.Finished {
		return *verdict.Result, nil
	}
	started := stream[0].Event.(events.RunStarted) // Classify checked it
	if diff := snapshotDiff(started.ParameterSnapshot, cfg.snapshot); len(diff) > 0 {
		return events.RunResult{}, fmt.Errorf("engine: resume %q: %w:\n  %s", req.RunID, ErrParametersChanged, strings.Join(diff, "\n  "))
	}
	m := newMachine(cfg)
	for _, env := range stream {
		m.step(input{kind: inReplayed, env: env})
	}
	return newDriver(def, req, stream[len(stream)-1].ID).drive(ctx, m)
}
