package report

import (
	"context"
	"errors"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// A Follower reads a run's stream as it grows — what `polyloop-inspect
// events --follow` and the viewer's follow endpoint print. Each Next
// returns the events made durable since the last, reading only those from
// a store that is a seams.RunTailer (the whole stream, then the part not
// yet returned, from others), up to the run's RunFinished. Liveness says
// when nobody drives the run any more, and when a driver takes it again.
// Not safe for concurrent use.
type Follower struct {
	store    seams.RunReader
	runID    string
	seen     int       // events returned
	last     ulid.ULID // the last of them
	finished bool
	shown    seams.RunStatus // the liveness last reported; "" before: presumed running
}

// NewFollower follows runID in store from its first event.
func NewFollower(store seams.RunReader, runID string) *Follower {
	return &Follower{store: store, runID: runID}
}

// Next returns the events after those it returned before, up to and
// including RunFinished: none while nothing new is durable, and once
// RunFinished was returned. A run the store does not hold, found so before
// any event was returned, is an error wrapping seams.ErrNoRun; a damaged
// stream, an error wrapping *events.DamageError (matching
// events.ErrCorruption); a run deleted or replaced since the last event
// returned, seams.ErrStreamChanged; a store failure, as the store returned
// it. Nothing is returned with an error.
func (f *Follower) Next(ctx context.Context) ([]events.Envelope, error) {
	if f.finished {
		return nil, nil
	}
	batch, err := seams.LoadAfter(ctx, f.store, f.runID, f.seen, f.last)
	if err != nil {
		return nil, err
	}
	if f.seen == 0 && len(batch) == 0 {
		return nil, noRun(f.runID)
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

// Shown tells the follower the liveness its reader shows already (running,
// awaiting or interrupted — a page rendered so), so that Liveness reports a
// change from it; a follower presumes a driver (running) until told.
func (f *Follower) Shown(status seams.RunStatus) { f.shown = status }

// Liveness asks the store who holds the run (Describe) and returns its
// entry with its liveness at now as Status (Live: running, awaiting or
// interrupted), with changed true when that differs from the liveness
// reported last (Shown's, or running at first). Nothing is reported —
// changed false — for a run whose RunFinished Next returned or whose entry
// says finished (Next will return it), whose entry is damaged (listed
// corrupt, or Describe's error matching events.ErrCorruption), or that the
// store no longer holds (Next says what became of it); another error is
// the store's.
func (f *Follower) Liveness(ctx context.Context) (info seams.RunInfo, changed bool, err error) {
	if f.finished {
		return seams.RunInfo{}, false, nil
	}
	info, err = Describe(ctx, f.store, f.runID)
	switch {
	case errors.Is(err, seams.ErrNoRun) || errors.Is(err, events.ErrCorruption):
		return info, false, nil
	case err != nil:
		return info, false, err
	case info.Status == seams.StatusFinished || info.Status == seams.StatusCorrupt:
		return info, false, nil
	}
	info.Status = Live(info, time.Now())
	shown := f.shown
	if shown == "" {
		shown = seams.StatusRunning
	}
	f.shown = info.Status
	return info, info.Status != shown, nil
}

// livenessEvery is how often Follow asks who holds a run while nothing
// new is durable (its poll when that is longer).
const livenessEvery = time.Second

// Follow hands each batch of new events to fn as Next returns it, asking
// every poll, until RunFinished has been handed over (it returns nil),
// ctx ends (ctx's error) or Next, fn or live fails (that error). With a
// live, it hands over the run's entry each time Liveness finds a change —
// that nobody drives the run, or that a driver took it — asking the store
// after the first events (at once when Next returned events before Follow
// was called), as soon as events come while nobody drove the run, and at
// most every second (or poll) while nothing comes.
func (f *Follower) Follow(ctx context.Context, poll time.Duration, fn func([]events.Envelope) error, live func(seams.RunInfo) error) error {
	tick := time.NewTicker(poll)
	defer tick.Stop()
	var asked time.Time // when Liveness last asked
	say := func() error {
		asked = time.Now()
		info, changed, err := f.Liveness(ctx)
		if ctxErr := ctx.Err(); ctxErr != nil {
			return ctxErr
		}
		if err != nil || !changed {
			return err
		}
		return live(info)
	}
	if live != nil && f.seen > 0 && !f.finished {
		if err := say(); err != nil {
			return err
		}
	}
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
		driverless := f.shown != "" && f.shown != seams.StatusRunning
		if live != nil && (asked.IsZero() || len(batch) > 0 && driverless || time.Since(asked) >= max(poll, livenessEvery)) {
			if err := say(); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}
