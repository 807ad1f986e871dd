package main

import (
	"context"
	"time"

	"github.com/polyloop/polyloop/events"
)

// followPoll is how often events --follow looks for new events.
var followPoll = 250 * time.Millisecond

// follow prints runID's events as they become durable, from the first,
// until the run finishes or ctx ends. It reads the store directly, so it
// follows a PostgreSQL store while agents write (a bbolt file can be
// followed only while no other process holds it; mount the viewer in the
// agent's process for that).
func (c *call) followRun(ctx context.Context, runID string, print func(env events.Envelope)) int {
	s, ok := c.openStore(c.args[0])
	if !ok {
		return exitProblem
	}
	defer s.Close()
	seen := 0
	for {
		stream, err := s.Load(ctx, runID)
		if ctx.Err() != nil {
			return exitOK
		}
		if err != nil {
			return c.fail("%s", clip(err.Error(), 2000))
		}
		for ; seen < len(stream); seen++ {
			print(stream[seen])
			if stream[seen].Kind == events.KindRunFinished {
				return exitOK
			}
		}
		select {
		case <-ctx.Done():
			return exitOK
		case <-time.After(followPoll):
		}
	}
}
