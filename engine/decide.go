package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"time"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
)

// AwaitingError is how Run and Resume return a run that waits, unfinished,
// for a person: it matches ErrAwaitingDecision, and Calls lists the calls
// awaiting a decision (engine/doc.go, "Human decisions", says why this is
// an error and not a RunResult).
type AwaitingError struct {
	RunID string
	// Calls are the pending calls. A step carries one action (a parser's
	// decision holds one tool call), so a run has one pending call at a
	// time; the list is what a caller iterates whatever the count.
	Calls []recovery.PendingCall
}

func (e *AwaitingError) Error() string {
	parts := make([]string, len(e.Calls))
	for i, c := range e.Calls {
		what := "action"
		if c.Tool != "" {
			what = fmt.Sprintf("%s(%s)", c.Tool, c.Arguments)
		}
		parts[i] = fmt.Sprintf("%s of step %d awaits %s (call %s)", what, c.Step, c.Awaits, c.Call)
	}
	return fmt.Sprintf("engine: run %q waits for a person: %s", e.RunID, strings.Join(parts, "; "))
}

// Unwrap returns ErrAwaitingDecision.
func (e *AwaitingError) Unwrap() error { return ErrAwaitingDecision }

// Errors of Decide and Resolve, beside ErrRunNotFound (which also matches
// seams.ErrNoRun), ErrRunBusy (seams.ErrRunLocked) and recovery.ErrCorrupt
// (events.ErrCorruption). Each refusal writes nothing. They are the seams'
// (seams/decision.go), so readers that offer decisions tell them apart
// without importing the engine.
var (
	ErrNoSuchCall      = seams.ErrNoSuchCall
	ErrNotPending      = seams.ErrNotPending
	ErrAlreadyDecided  = seams.ErrAlreadyDecided
	ErrInvalidDecision = seams.ErrInvalidDecision
)

// decideWait bounds how long Decide and Resolve wait for a driver that
// holds the run (one finding it awaiting, or one that resumes it) to let
// go before reporting ErrRunBusy.
const decideWait = 3 * time.Second

// Decide records a person's decision on a call awaiting approval:
// d.Verdict approved (optionally with edited d.Arguments, a JSON object
// checked against the tool's parameter schema recorded with the call) or
// rejected, by d.By (an opaque name, required), with an optional d.Note.
// d.RunID names the run and d.ResultID the call (PendingCall.Call). The
// decision is one durable event under the tail rule: of two people
// deciding at once, exactly one is recorded, and the other gets
// ErrAlreadyDecided — on a store that reserves runs (seams.RunLocker:
// kv, pgstore, MemStore) it waits for the first to finish and reads its
// decision; on one that does not, it may get ErrRunBusy (ask again). It needs
// no driver: Resume (or a worker) then executes an approved action once,
// with its pre-allocated result id, or completes a rejected one not
// executed, the model told "rejected by reviewer: <note>". A store that
// queues runs for workers (seams.RunQueue) gets the run handed back at
// once.
//
// Decide refuses, writing nothing: an invalid decision
// (ErrInvalidDecision), a run with no log (ErrRunNotFound), a damaged one
// (recovery.ErrCorrupt), a call not in the run (ErrNoSuchCall), one that
// does not await approval (ErrNotPending), one already decided
// (ErrAlreadyDecided), and a run a driver holds past a short wait
// (ErrRunBusy).
func Decide(ctx context.Context, store seams.RunStore, d events.Decision) (events.Envelope, error) {
	if d.Verdict.Resolves() {
		return events.Envelope{}, fmt.Errorf("%w: %s is an operator's finding on an action in doubt: use Resolve", ErrInvalidDecision, d.Verdict)
	}
	return record(ctx, store, d)
}

// Resolve records an operator's finding on an action whose outcome a crash
// left in doubt — one whose intent is the run's tail (recovery's
// ActionUnknown, whatever its replay policy) or that awaits a resolution
// (Request.AwaitResolution): d.Verdict executed, with d.Observation what
// they saw of its effect (the observation the model is fed), or
// not_executed. Resume then completes the step as found and goes on,
// never executing the action. It refuses as Decide refuses; a call that is
// not in doubt (awaiting approval, completed) is ErrNotPending, and a run
// a live driver holds — its action is in progress, not in doubt — is
// ErrRunBusy. That last refusal is the store's reservation
// (seams.RunLocker): a store without one cannot tell a dead driver from
// a live one, and on a store whose reservations are leases (pgstore) a
// driver cut off from it past its lease looks dead — its action may
// still complete after the finding, though the log stays sound (its
// late append is refused by the tail rule) and says the operator's
// word. Resolve a run whose lease ran out only once its worker is known
// to be gone.
func Resolve(ctx context.Context, store seams.RunStore, d events.Decision) (events.Envelope, error) {
	if d.Verdict != "" && !d.Verdict.Resolves() {
		return events.Envelope{}, fmt.Errorf("%w: %s answers an approval: use Decide", ErrInvalidDecision, d.Verdict)
	}
	return record(ctx, store, d)
}

// record is Decide and Resolve: take the run, check the decision against
// its log, append it after the log's last event.
func record(ctx context.Context, store seams.RunStore, d events.Decision) (events.Envelope, error) {
	runID := d.RunID
	if err := seams.ValidRunID(runID); err != nil {
		return events.Envelope{}, fmt.Errorf("%w: %w", ErrInvalidDecision, err)
	}
	if err := d.Validate(); err != nil {
		return events.Envelope{}, fmt.Errorf("%w: run %q: %w", ErrInvalidDecision, runID, err)
	}
	verb := "decide on"
	if d.Verdict.Resolves() {
		verb = "resolve"
	}
	release, err := lockWaiting(ctx, store, runID)
	if err != nil {
		return events.Envelope{}, fmt.Errorf("engine: %s call %q of run %q: %w", verb, d.ResultID, runID, err)
	}
	env, err := func() (events.Envelope, error) {
		defer release()
		stream, err := store.Load(ctx, runID)
		log := recovery.NewClassifier(runID)
		for _, env := range stream {
			log.Apply(env)
		}
		switch _, err = log.Verdict(err); {
		case err != nil:
			return events.Envelope{}, err
		case len(stream) == 0:
			return events.Envelope{}, runNotFound
		}
		d, err := decidable(log.Fold(), stream, d)
		if err != nil {
			return events.Envelope{}, err
		}
		envs, err := store.Append(ctx, runID, stream[len(stream)-1].ID, d)
		if errors.Is(err, seams.ErrTailMoved) {
			return events.Envelope{}, fmt.Errorf("%w: another writer appended to the run meanwhile; ask again: %w", ErrRunBusy, err)
		}
		if err != nil {
			return events.Envelope{}, err
		}
		return envs[0], nil
	}()
	if err != nil {
		return events.Envelope{}, fmt.Errorf("engine: %s call %q of run %q: %w", verb, d.ResultID, runID, err)
	}
	// The run waits no more: hand it to the workers now, rather than when
	// a worker next looks at the runs it parked (a run no pool queues, or
	// one a worker took meanwhile, is left as it is).
	if q, ok := store.(seams.RunQueue); ok {
		_ = q.RequeueRun(ctx, runID)
	}
	return env, nil
}

// lockWaiting takes runID as a driver would, waiting up to decideWait for
// a driver that holds it to let go.
func lockWaiting(ctx context.Context, store seams.RunStore, runID string) (func(), error) {
	deadline := time.Now().Add(decideWait)
	for wait := 10 * time.Millisecond; ; wait *= 2 {
		release, err := lockRun(store, runID)
		if !errors.Is(err, ErrRunBusy) || time.Now().After(deadline) {
			return release, err
		}
		t := time.NewTimer(min(wait, 500*time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, context.Cause(ctx)
		case <-t.C:
		}
	}
}

// runNotFound is Decide's and Resolve's refusal of a run with no log: it
// matches ErrRunNotFound, and seams.ErrNoRun for readers that know no
// engine.
var runNotFound = refusal{text: "no such run", is: []error{ErrRunNotFound, seams.ErrNoRun}}

// refusal is an error with a text of its own that matches several.
type refusal struct {
	text string
	is   []error
}

func (r refusal) Error() string   { return r.text }
func (r refusal) Unwrap() []error { return r.is }

// decidable checks decision d against the log f folds (stream) that it
// would follow: the call must be the step's pending action, awaiting the
// kind of decision d is, and not decided yet — whatever became of it
// since; edited arguments must satisfy the recorded schema, and are
// returned in d as the action will run with them (exactArguments).
func decidable(f *recovery.Fold, stream []events.Envelope, d events.Decision) (events.Decision, error) {
	cur := f.Current
	if cur.Action == nil || cur.Action.ResultID != d.ResultID {
		return d, notPending(stream, d)
	}
	state := f.State()
	if !d.Verdict.Resolves() {
		switch {
		case cur.Decision != nil:
			return d, fmt.Errorf("%w: %s by %q", ErrAlreadyDecided, cur.Decision.Verdict, cur.Decision.By)
		case state == recovery.AwaitingApproval:
		default:
			return d, fmt.Errorf("%w: it awaits no approval (state %s)", ErrNotPending, state)
		}
		if d.Arguments != nil {
			if cur.Action.ToolName == "" || cur.Action.ArgumentsSchema == "" {
				return d, fmt.Errorf("%w: the action calls no tool whose arguments could be edited", ErrInvalidDecision)
			}
			if err := seams.ValidateArguments(cur.Action.ToolName, cur.Action.ArgumentsSchema, *d.Arguments); err != nil {
				return d, fmt.Errorf("%w: edited arguments: %w", ErrInvalidDecision, err)
			}
			exact, err := exactArguments(*d.Arguments)
			if err != nil {
				return d, fmt.Errorf("%w: edited arguments: %w", ErrInvalidDecision, err)
			}
			d.Arguments = &exact
		}
		return d, nil
	}
	switch state {
	case recovery.ActionUnknown, recovery.AwaitingResolution:
		return d, nil
	case recovery.Resolved:
		return d, fmt.Errorf("%w: found %s by %q", ErrAlreadyDecided, cur.Resolution.Verdict, cur.Resolution.By)
	}
	return d, fmt.Errorf("%w: its outcome is not in doubt (state %s: the action has not run)", ErrNotPending, state)
}

// exactArguments is edited arguments (a JSON object) as the action runs
// with them: decoded as every tool call's arguments are, JSON numbers as
// float64, and encoded again, so that the text recorded is the text that
// runs. A number a float64 cannot hold exactly (an account id of 17
// digits) is refused rather than run changed.
func exactArguments(text string) (string, error) {
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	var exact any
	if err := dec.Decode(&exact); err != nil {
		return "", err
	}
	if n, bad := inexactNumber(exact); bad {
		return "", fmt.Errorf("the number %s cannot be held exactly by a tool call's arguments (a float64): send it as a string", n)
	}
	var args map[string]any
	if err := json.Unmarshal([]byte(text), &args); err != nil {
		return "", err
	}
	b, err := json.Marshal(args)
	return string(b), err
}

// inexactNumber finds, in a value decoded with json.Number, a number that
// changes when held as a float64.
func inexactNumber(v any) (string, bool) {
	switch v := v.(type) {
	case json.Number:
		// The decimal the reviewer wrote against the shortest decimal
		// that float64 reads back as itself: 0.1 is kept, a 17-digit
		// id is not.
		f, err := strconv.ParseFloat(string(v), 64)
		wrote, ok := new(big.Rat).SetString(string(v))
		held, _ := new(big.Rat).SetString(strconv.FormatFloat(f, 'g', -1, 64))
		if err != nil || !ok || held == nil || wrote.Cmp(held) != 0 {
			return string(v), true
		}
	case map[string]any:
		for _, e := range v {
			if n, bad := inexactNumber(e); bad {
				return n, true
			}
		}
	case []any:
		for _, e := range v {
			if n, bad := inexactNumber(e); bad {
				return n, true
			}
		}
	}
	return "", false
}

// notPending says why a call that is not the step's pending action cannot
// be decided: it was decided (of d's kind) before its step completed, it
// is an earlier, completed call of the run, or none of its.
func notPending(stream []events.Envelope, d events.Decision) error {
	call, step := d.ResultID, -1
	for _, env := range stream {
		switch ev := env.Event.(type) {
		case events.Intent:
			if ev.ResultID != call {
				break
			}
			if ev.IntentKind == events.IntentModelCall {
				return fmt.Errorf("%w: %q is the model call of step %d, not an action", ErrNotPending, call, ev.CallIndex)
			}
			step = ev.CallIndex
		case events.Decision:
			if ev.ResultID == call && ev.Verdict.Resolves() == d.Verdict.Resolves() {
				return fmt.Errorf("%w: %s by %q (the step has completed since)", ErrAlreadyDecided, ev.Verdict, ev.By)
			}
		}
	}
	if step < 0 {
		return fmt.Errorf("%w: %q", ErrNoSuchCall, call)
	}
	return fmt.Errorf("%w: the action of step %d has completed", ErrNotPending, step)
}
