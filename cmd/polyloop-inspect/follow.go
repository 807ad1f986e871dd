package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/report"
	"github.com/polyloop/polyloop/seams"
)

// followPoll is how often events --follow looks for new events.
var followPoll = 250 * time.Millisecond

// followRun prints runID's events as they become durable, from the first,
// until the run finishes or ctx ends (report.Follower). It follows a
// PostgreSQL store while agents write, and a bbolt file through the
// socket of the process that writes it (kv.Reader, which holds the file
// only while it reads).
func (c *call) followRun(ctx context.Context, runID string, print func(env events.Envelope)) int {
	s, ok := c.openStore(c.args[0])
	if !ok {
		return exitProblem
	}
	defer s.Close()
	return c.followIn(ctx, s, runID, print)
}

// followIn is followRun on an open store. A run the store does not hold is
// an error. While nobody drives the run it says so on standard error, with
// its status as a listing gives it from the events printed (report.Status:
// awaiting, interrupted, in_doubt, awaiting_approval, awaiting_resolution),
// once, and again when a driver takes the run; it goes on following either
// way, since a worker, an operator or a person's decision may continue it.
func (c *call) followIn(ctx context.Context, s seams.RunReader, runID string, print func(env events.Envelope)) int {
	var fold recovery.Fold // of the events printed: where the run's tail stands
	batch, live := c.followFuncs(runID, &fold, print)
	follower := report.NewFollower(s, runID)
	follow := func() error {
		return follower.Follow(ctx, followPoll, batch, live)
	}
	err := follow()
	for errors.Is(err, kv.ErrWriterGone) && ctx.Err() == nil {
		// The writer died mid-read: the file is free now, and a new writer
		// may resume the run; the follower goes on from the events printed.
		fmt.Fprintf(c.stderr, "polyloop-inspect: %s; still following\n", clip(err.Error(), 2000))
		select {
		case <-ctx.Done():
		case <-time.After(followPoll):
		}
		err = follow()
	}
	switch {
	case err == nil || ctx.Err() != nil:
		return exitOK
	case errors.Is(err, seams.ErrNoRun):
		return c.fail("no run %q in %s", clip(runID, 80), c.store())
	}
	return c.fail("%s", clip(err.Error(), 2000))
}

// followFuncs are followIn's printing of a batch of events (folded into
// fold) and of a change in who drives the run.
func (c *call) followFuncs(runID string, fold *recovery.Fold, print func(env events.Envelope)) (batch func([]events.Envelope) error, live func(seams.RunInfo) error) {
	batch = func(batch []events.Envelope) error {
		for _, env := range batch {
			fold.Apply(env.Event)
			print(env)
		}
		return nil
	}
	live = func(info seams.RunInfo) error {
		now := time.Now()
		status := report.Status(info, recovery.Verdict{State: fold.State()}, nil, now)
		what := escape(report.Liveness(status, info, now))
		if status.Held() {
			fmt.Fprintf(c.stderr, "polyloop-inspect: run %q is running again: %s\n", clip(runID, 80), what)
		} else {
			fmt.Fprintf(c.stderr, "polyloop-inspect: run %q is %s: %s; still following\n", clip(runID, 80), status, what)
		}
		return nil
	}
	return batch, live
}
