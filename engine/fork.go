package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
)

// ErrForkStep: Fork was asked for a step beyond the source's completed
// steps.
var ErrForkStep = errors.New("step beyond the source's completed steps")

// Fork starts the run req.RunID as a fork of the run source at step: its
// log begins with the source's verified prefix up to the end of step
// step-1 (0 ≤ step ≤ the source's completed steps), copied in one
// transaction by a store that forks runs (seams.RunForker: kv, pgstore,
// MemStore), and it goes on under def and req — the model, parser,
// prompt, budget or tools may differ from the source's: that is what a
// fork is for. Its RunStarted records where it came from
// (events.ForkOrigin: the source, the step, the key of the last event
// copied) and how its parameters differ from the source's, listed as
// Resume lists a refusal's — recorded, not refused. Fork then drives the
// run as Run does; the copied steps are history, so nothing in them is
// executed again, and the first thing the fork does is a new model call
// (unless the copied steps already call for a stop: a final answer in
// the last one, a budget the new request sets lower).
//
// Fork fails, writing nothing: as Run fails for an invalid definition or
// request, with ErrRunExists when req.RunID has a log, ErrRunNotFound
// when source has none, an error matching recovery.ErrCorrupt when the
// source's log is not sound, and ErrForkStep for a step beyond its end.
// A source that finished, or is still being driven, forks alike: the
// copy is of the prefix as read, whatever is appended after it. The
// definition's sink hears the fork's RunStarted, then its own events.
//
// A fork started for an agent (req.Agent) is queued for that agent's
// workers, who rebuild its definition and request from the agent: a fork
// under parameters the agent does not build (another model, say) that
// stops unfinished is then refused by their Resume (changed parameters)
// and retried in vain. Fork such runs without an Agent, and resume them
// in the program that forked them.
func Fork(ctx context.Context, def Definition, req Request, source string, step int) (events.RunResult, error) {
	cfg, err := prepare(def, req)
	if err != nil {
		return events.RunResult{}, err
	}
	switch {
	case seams.ValidRunID(source) != nil:
		return events.RunResult{}, fmt.Errorf("%w: fork source: %w", ErrInvalidRequest, seams.ValidRunID(source))
	case source == req.RunID:
		return events.RunResult{}, fmt.Errorf("%w: a run cannot be forked onto itself (%q)", ErrInvalidRequest, source)
	case step < 0:
		return events.RunResult{}, fmt.Errorf("%w: fork step %d is negative", ErrInvalidRequest, step)
	}
	forker, ok := def.Store.(seams.RunForker)
	if !ok {
		return events.RunResult{}, fmt.Errorf("engine: fork %q: the store (%T) does not fork runs", source, def.Store)
	}
	release, err := lockRun(def.Store, req.RunID)
	if errors.Is(err, ErrRunBusy) {
		return events.RunResult{}, fmt.Errorf("engine: run %q: %w: %w", req.RunID, ErrRunExists, err)
	}
	if err != nil {
		return events.RunResult{}, err
	}
	defer release()
	started, through, n, err := forkPrefix(ctx, def.Store, source, step)
	if err != nil {
		return events.RunResult{}, err
	}
	origin := &events.ForkOrigin{Run: source, Step: step,
		Differences: append(snapshotDiff(started.ParameterSnapshot, cfg.snapshot), startedDiff(started, req)...)}
	if up := started.Fork; up != nil {
		// A fork of a fork: the prefix holds the source's own copied
		// steps, naming its ancestors.
		for _, a := range append(slices.Clone(up.Ancestry), events.Ancestor{Run: up.Run, Steps: up.Step}) {
			if a.Steps = min(a.Steps, step); a.Steps > 0 && (len(origin.Ancestry) == 0 || a.Steps > origin.Ancestry[len(origin.Ancestry)-1].Steps) {
				origin.Ancestry = append(origin.Ancestry, a)
			}
		}
	}
	if n > 0 {
		origin.LastKey = through.String()
	}
	envs, err := forker.ForkRun(ctx, req.RunID, events.RunStarted{RunID: req.RunID, ParameterSnapshot: cfg.snapshot,
		SchemaVersion: events.CurrentSchemaVersion, Agent: req.Agent, Input: req.Input, Fork: origin}, source, through, n)
	switch {
	case errors.Is(err, seams.ErrRunExists):
		return events.RunResult{}, fmt.Errorf("engine: fork onto %q: %w", req.RunID, ErrRunExists)
	case errors.Is(err, seams.ErrNoRun): // deleted since it was read
		return events.RunResult{}, fmt.Errorf("engine: fork from %q: %w: %w", source, ErrRunNotFound, err)
	case err != nil:
		return events.RunResult{}, fmt.Errorf("engine: fork %q from %q at step %d: %w", req.RunID, source, step, err)
	}
	m := newMachine(cfg)
	for _, env := range envs {
		m.step(input{kind: inReplayed, env: env})
	}
	if _, err := m.log.Verdict(nil); err != nil {
		return events.RunResult{}, fmt.Errorf("engine: fork %q: %w", req.RunID, err)
	}
	d := newDriver(def, req, envs[len(envs)-1].ID)
	// The sink hears the fork's start, durable now, as it hears any run's;
	// the copied events are the source's, delivered when they were written.
	d.emit(ctx, envs[0])
	return d.drive(ctx, m)
}

// forkPrefix reads source and finds the prefix a fork at step copies:
// the source's RunStarted, the key of the last event of step step-1
// (zero for step 0) and the number of events after RunStarted up to it.
func forkPrefix(ctx context.Context, store seams.RunStore, source string, step int) (events.RunStarted, ulid.ULID, int, error) {
	stream, loadErr := store.Load(ctx, source)
	log := recovery.NewClassifier(source)
	for _, env := range stream {
		log.Apply(env)
	}
	v, err := log.Verdict(loadErr)
	switch {
	case err != nil:
		return events.RunStarted{}, ulid.ULID{}, 0, fmt.Errorf("engine: fork from %q: %w", source, err)
	case len(stream) == 0:
		return events.RunStarted{}, ulid.ULID{}, 0, fmt.Errorf("engine: fork from %q: %w", source, ErrRunNotFound)
	case step > len(v.Steps()):
		return events.RunStarted{}, ulid.ULID{}, 0, fmt.Errorf("engine: fork from %q at step %d: %w (it completed %d)", source, step, ErrForkStep, len(v.Steps()))
	}
	started := stream[0].Event.(events.RunStarted)
	completed := 0
	for i, env := range stream[1:] {
		if completed == step {
			if i == 0 {
				return started, ulid.ULID{}, 0, nil
			}
			return started, stream[i].ID, i, nil
		}
		if env.Kind == events.KindStepCompleted {
			completed++
		}
	}
	return started, stream[len(stream)-1].ID, len(stream) - 1, nil
}
