package seams

import (
	"context"
	"errors"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
)

// RunForker is implemented by stores that fork runs (engine.Fork): a new
// run whose log is a prefix of another's, copied in one transaction.
// kv.Store, pgstore.Store and seamstest.MemStore implement it;
// proptest.RunForkerContract checks an implementation.
type RunForker interface {
	// ForkRun writes, in one transaction, started (the new run's
	// RunStarted, naming runID) followed by the events of source's stream
	// from its second up to and including the one with key through — none
	// for a zero through — under fresh keys of runID, in order: the values
	// as the source stores them, payloads byte for byte (they name the
	// source run), sealed for the new run. It returns the events written.
	// It writes nothing and fails with ErrRunExists when runID has a log,
	// ErrNoRun when source has none, and ErrForkPrefix when through is not
	// a key of source's stream or the events up to it are not n (the
	// caller's count: the source was rewritten since it was read). A
	// source appended to meanwhile is copied up to through: a prefix the
	// caller read, whatever follows it. A prefix through the source's
	// RunFinished makes a finished fork, listed and queued as finished,
	// whose log recovery refuses (its end names the source); engine.Fork
	// copies whole steps and never asks for one.
	ForkRun(ctx context.Context, runID string, started events.RunStarted, source string, through ulid.ULID, n int) ([]events.Envelope, error)
}

// ErrForkPrefix: the prefix a fork asked to copy is not the source's
// stream as the store holds it now.
var ErrForkPrefix = errors.New("seams: the source's prefix is not as read")
