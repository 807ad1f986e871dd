package main

import (
	"context"
	"time"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/report"
)

// followPoll is how often events --follow looks for new events.
var followPoll = 250 * time.Millisecond

// follow prints runID's events as they become durable, from the first,
// until the run finishes or ctx ends (report.Follower). It reads the store
// directly, so it follows a PostgreSQL store while agents write (a bbolt
// file can be followed only while no other process holds it; mount the
// viewer in the agent's process for that).
func (c *call) followRun(ctx context.Context, runID string, print func(env events.Envelope)) int {
	s, ok := c.openStore(c.args[0])
	if !ok {
		return exitProblem
	}
	defer s.Close()
	err := report.NewFollower(s, runID).Follow(ctx, followPoll, func(batch []events.Envelope) error {
		for _, env := range batch {
			print(env)
		}
		return nil
	})
	if err != nil && ctx.Err() == nil {
		return c.fail("%s", clip(err.Error(), 2000))
	}
	return exitOK
}
