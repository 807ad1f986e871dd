package report

import (
	"context"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// A Follower reads a run's stream as it grows — what `polyloop-inspect
// events --follow` and the viewer's follow endpoint print. Each Next
// returns the events made durable since the last, reading only those from
// a store that is a seams.RunTailer (the whole stream, then the part not
// yet returned, from others), up to the run's RunFinished. Not safe for
// concurrent use.
type Follower struct {
	store    seams.RunReader
	runID    string
	seen     int       // events returned
	last     ulid.ULID // the last of them
	finished bool
}

// NewFollower follows runID in store from its first event.
func NewFollower(store seams.RunReader, runID string) *Follower {
	return &Follower{store: store, runID: runID}
}

// Next returns the events after those it returned before, up to and
// including RunFinished: none while nothing new is durable (or the run has
// not started) and once RunFinished was returned. A damaged stream is an
// error wrapping *events.DamageError (matching events.ErrCorruption); a
// run deleted or replaced since the last event returned,
// seams.ErrStreamChanged; a store failure, as the store returned it.
// Nothing is returned with an error.
func (f *Follower) Next(ctx context.Context) ([]events.Envelope, error) {
	if f.finished {
		return nil, nil
	}
	batch, err := seams.LoadAfter(ctx, f.store, f.runID, f.seen, f.last)
	if err != nil {
		return nil, err
	}
	for i, env := range batch {
		if env.Kind == events.KindRunFinished {
			batch, f.finished = batch[:i+1], true
			break
		}
	}
	if len(batch) > 0 {
		f.seen, f.last = f.seen+len(batch), batch[len(batch)-1].ID
	}
	return batch, nil
}

// Seen is how many events Next has returned.
func (f *Follower) Seen() int { return f.seen }

// Finished reports whether Next has returned the run's RunFinished:
// nothing follows it.
func (f *Follower) Finished() bool { return f.finished }

// Follow hands each batch of new events to fn as Next returns it, asking
// every poll, until RunFinished has been handed over (it returns nil),
// ctx ends (ctx's error) or Next or fn fails (that error).
func (f *Follower) Follow(ctx context.Context, poll time.Duration, fn func([]events.Envelope) error) error {
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		batch, err := f.Next(ctx)
		if ctxErr := ctx.Err(); ctxErr != nil {
			return ctxErr
		}
		if err != nil {
			return err
		}
		if len(batch) > 0 {
			if err := fn(batch); err != nil {
				return err
			}
		}
		if f.finished {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}
