package report

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
)

// Status is the listing status of a run whose entry is info and whose log
// recovery classified as v (err: why it is corrupt), at now. The log says
// corrupt and finished; an unfinished run's status is its liveness
// (Live): running when a live driver holds it, whatever its tail — an
// intent without its result is then a call in progress, not a side
// effect in doubt — and, for a run nobody holds, in_doubt when its tail
// leaves a side effect's outcome unknown, awaiting_approval or
// awaiting_resolution when an action waits for a person, awaiting or
// interrupted otherwise.
func Status(info seams.RunInfo, v recovery.Verdict, err error, now time.Time) seams.RunStatus {
	switch {
	case err != nil:
		return seams.StatusCorrupt
	case v.State == recovery.Finished:
		return seams.StatusFinished
	}
	s := Live(info, now)
	switch tail := v.State.Status(); {
	case s == seams.StatusRunning:
	case tail != seams.StatusRunning: // in_doubt, awaiting_approval, awaiting_resolution
		return tail
	}
	return s
}

// Live is the liveness at now of an unfinished run whose listing entry is
// info: running, awaiting or interrupted, as seams.RunInfo.Liveness
// tells them from the entry's holder and queue. An entry the store gave as
// awaiting or interrupted stays so (the store's clock ran the lease out);
// any other — running, or finished or corrupt in an entry read before the
// stream it is beside — is judged by its holder, so a holder whose lease
// has run out since the store listed the run no longer holds it, and an
// entry that names no holder (from a store that lists its index's word
// unrefined) is a run nobody holds, as the contract defines running.
func Live(info seams.RunInfo, now time.Time) seams.RunStatus {
	if info.Status != seams.StatusAwaiting && info.Status != seams.StatusInterrupted {
		info.Status = seams.StatusRunning
	}
	info.Liveness(now)
	return info.Status
}

// Describe is runID's entry as store lists it, with its liveness:
// seams.RunDescriber.Describe, or the run's entry among RunReader.Runs of
// a store that is not one. A run the store does not hold is an error
// wrapping seams.ErrNoRun.
func Describe(ctx context.Context, store seams.RunReader, runID string) (seams.RunInfo, error) {
	if d, ok := store.(seams.RunDescriber); ok {
		info, err := d.Describe(ctx, runID)
		if err != nil && !errors.Is(err, seams.ErrNoRun) {
			return info, err
		}
		if err != nil {
			return info, noRun(runID)
		}
		return info, nil
	}
	infos, err := store.Runs(ctx)
	if err != nil {
		return seams.RunInfo{}, err
	}
	for _, info := range infos {
		if info.RunID == runID {
			return info, nil
		}
	}
	return seams.RunInfo{}, noRun(runID)
}

// noRun is the error for a run the store does not hold.
func noRun(runID string) error {
	return fmt.Errorf("no run %q in the store: %w", Clip(runID, 80), seams.ErrNoRun)
}

// Holder is who holds a run with status s and entry info, in a few
// words for a table: "W until T" for a run a driver holds (W alone when
// its hold lasts as long as its process), "lease of W ran out at T" for a
// run nobody holds whose last holder's lease ran out, "-" otherwise
// (finished, corrupt, never held, or given back). Times are Clock's.
func Holder(s seams.RunStatus, info seams.RunInfo, now time.Time) string {
	if !s.Resumable() || info.Owner == "" {
		return "-"
	}
	switch {
	case Live(info, now) == seams.StatusRunning && info.LeaseExpires.IsZero():
		return info.Owner
	case Live(info, now) == seams.StatusRunning:
		return fmt.Sprintf("%s until %s", info.Owner, Clock(info.LeaseExpires, now))
	case !info.LeaseExpires.IsZero() && !now.Before(info.LeaseExpires):
		return fmt.Sprintf("lease of %s ran out at %s", info.Owner, Clock(info.LeaseExpires, now))
	}
	return "-"
}

// Liveness says in a sentence who drives an unfinished run with status s
// and entry info: "W drives it (lease until T)", "nobody drives it (lease
// of W ran out at T)", "nobody drives it; it waits for a worker of agent
// A", "nobody drives it; it waits for a person's decision" (or "for an
// operator's finding": a run awaiting approval or a finding on an action
// in doubt, which no worker continues before), then the failures that
// gave it back, when it may be claimed again, and a cancel request, when
// there are. Empty for a finished or corrupt run.
func Liveness(s seams.RunStatus, info seams.RunInfo, now time.Time) string {
	if !s.Resumable() && !AwaitsPerson(s) {
		return ""
	}
	var text string
	switch live := Live(info, now); {
	case s == seams.StatusAwaitingApproval:
		text = "nobody drives it; it waits for a person's decision (approve or reject the pending call)"
	case s == seams.StatusAwaitingResolution:
		text = "nobody drives it; it waits for an operator's finding on the action in doubt (executed or not)"
	case live == seams.StatusRunning && info.LeaseExpires.IsZero():
		text = fmt.Sprintf("%s drives it", orSomeone(info.Owner))
	case live == seams.StatusRunning:
		text = fmt.Sprintf("%s drives it (lease until %s)", orSomeone(info.Owner), Clock(info.LeaseExpires, now))
	case info.Owner != "" && !info.LeaseExpires.IsZero():
		text = fmt.Sprintf("nobody drives it (lease of %s ran out at %s)", info.Owner, Clock(info.LeaseExpires, now))
	case live == seams.StatusAwaiting:
		text = fmt.Sprintf("nobody drives it; it waits for a worker of agent %s", info.Agent)
	default:
		text = "nobody drives it (its driver stopped)"
	}
	if info.Failures > 0 {
		text += fmt.Sprintf("; given back after %s", Plural(info.Failures, "failure"))
		if info.LastError != "" {
			text += fmt.Sprintf(", the last: %s", Clip(info.LastError, 200))
		}
		if info.RetryAt.After(now) {
			text += fmt.Sprintf(", claimable again at %s", Clock(info.RetryAt, now))
		}
	}
	if c := info.CancelRequested; c != nil {
		text += fmt.Sprintf("; cancel requested by %s at %s", orSomeone(c.By), Clock(c.At, now))
	}
	return text
}

func orSomeone(name string) string {
	if name == "" {
		return "a driver"
	}
	return name
}

// Clock is a time near now as readers print it beside a holder: UTC,
// the time of day alone on now's day ("15:04:05Z"), the date too on
// another ("2026-11-30T15:04:05Z").
func Clock(t, now time.Time) string {
	t, now = t.UTC(), now.UTC()
	if y, m, d := t.Date(); now.Year() == y && now.Month() == m && now.Day() == d {
		return t.Format("15:04:05Z")
	}
	return t.Format("2006-01-02T15:04:05Z")
}

// LivenessJSON is who drives a run and its place in the workers' queue,
// in JSON: the entry's coordination fields (seams.RunInfo), null where
// absent. Owner is the last holder whatever its lease; the status says
// whether it holds the run.
type LivenessJSON struct {
	Agent           *string     `json:"agent"`
	Owner           *string     `json:"owner"`
	LeaseExpires    *string     `json:"lease_expires"`
	Failures        int         `json:"failures"`
	LastError       *string     `json:"last_error"`
	RetryAt         *string     `json:"retry_at"`
	CancelRequested *CancelJSON `json:"cancel_requested"`
}

// CancelJSON is an operator's request to cancel a run, in JSON.
type CancelJSON struct {
	By string `json:"by"`
	At string `json:"at"`
}

// LivenessOf is info's coordination fields in JSON.
func LivenessOf(info seams.RunInfo) LivenessJSON {
	j := LivenessJSON{Agent: stringOrNil(info.Agent), Owner: stringOrNil(info.Owner), LeaseExpires: stampOrNil(info.LeaseExpires),
		Failures: info.Failures, LastError: stringOrNil(info.LastError), RetryAt: stampOrNil(info.RetryAt)}
	if c := info.CancelRequested; c != nil {
		j.CancelRequested = &CancelJSON{By: c.By, At: Stamp(c.At)}
	}
	return j
}

func stringOrNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// withCoordination is entry, a stream's summary, with what the store's
// listing info knows of the run beside its stream: its coordination
// fields, and, for a stream without RunFinished, the store's word that
// nobody holds the run (awaiting, interrupted).
func withCoordination(entry, info seams.RunInfo) seams.RunInfo {
	if entry.Status == seams.StatusRunning && (info.Status == seams.StatusAwaiting || info.Status == seams.StatusInterrupted) {
		entry.Status = info.Status
	}
	entry.Agent, entry.Owner, entry.LeaseExpires = info.Agent, info.Owner, info.LeaseExpires
	entry.Failures, entry.LastError, entry.RetryAt = info.Failures, info.LastError, info.RetryAt
	entry.CancelRequested = info.CancelRequested
	return entry
}
