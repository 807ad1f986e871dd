package seams

import "errors"

// The refusals of a person's decision on a pending call (engine.Decide,
// engine.Resolve, which name them too). They live here so that a reader
// that offers decisions — the viewer — tells them apart without importing
// the engine. Each refusal writes nothing.
var (
	// ErrNoSuchCall: the run has no action of that call id (it may be
	// another run's call).
	ErrNoSuchCall = errors.New("no such call in this run")
	// ErrNotPending: the call is the run's, but does not await the
	// decision asked for (it completed, awaits another kind of decision,
	// or its outcome is not in doubt).
	ErrNotPending = errors.New("the call does not await this decision")
	// ErrAlreadyDecided: a decision on the call is already recorded.
	ErrAlreadyDecided = errors.New("the call is already decided")
	// ErrInvalidDecision: the decision itself is wrong (no name, a verdict
	// of the other kind, edited arguments the tool's schema refuses).
	ErrInvalidDecision = errors.New("invalid decision")
)
