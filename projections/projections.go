// Package projections folds a run's event stream into the views people and
// code read: the RunLog (every record by type, people's decisions among
// them), the trajectory ([]events.StepRecord), the RunResult, the usage,
// and the index entry a store keeps (Summarize).
//
// Every view is a fold: Apply takes one envelope at a time, and folding a
// whole stream gives the same view as applying its events one by one, so a
// live consumer of an EventSink and a reader of a stored stream agree. The
// run's own fold — steps, usage, result — is recovery.Fold, the one the
// engine runs on; a RunLog adds the records by type. Folds trust their
// input: they do not judge whether a stream is sound; that is package
// recovery's Classifier.
//
// # Decisions in an export
//
// A person's decision on an action (schema 1.5: an approval, a rejection,
// an operator's finding on an outcome in doubt) is a Decision event of its
// own; the trajectory's StepRecord keeps its eighteen fields and shows
// only what the decision did to the step: tool_arguments are the
// arguments that ran — the edited ones, for an approval that edited them;
// a rejected step is not_executed, its observation (in the observation
// template) "rejected by reviewer: <note>"; a step an operator resolved
// is completed as found — executed with their observation, or
// not_executed — its observation marked synthetic. Who decided, when, and
// on which call live in the Decision event (its envelope's time is when)
// and in a RunLog's Decisions, which add the step's index.
package projections

import (
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
)

// RunLog holds a stream's records by type, in stream order.
type RunLog struct {
	Started      *events.RunStarted
	Intents      []events.Intent
	ModelResults []events.ModelCallResult
	Steps        []events.StepCompleted
	Finished     *events.RunFinished
	// Decisions are the people's decisions on the run's actions, in
	// stream order.
	Decisions []Decision
	// Events counts every envelope applied, including any the fold ignored.
	Events int

	run recovery.Fold // steps, usage and result
}

// Decision is a person's decision as a RunLog shows it: the Decision
// record's fields, the index of the step it was made in, and its event's
// key and time (when it was made).
type Decision struct {
	ID   ulid.ULID `json:"id"`
	Step int       `json:"step"`
	// Call is the result id of the action decided on.
	Call    string         `json:"call"`
	Verdict events.Verdict `json:"verdict"`
	By      string         `json:"by"`
	Note    string         `json:"note,omitempty"`
	// Arguments are an approval's edited arguments (JSON text), nil when
	// it edited none; Observation is a finding of executed's observation.
	Arguments   *string   `json:"arguments,omitempty"`
	Observation *string   `json:"observation,omitempty"`
	At          time.Time `json:"at"`
}

// Apply folds one envelope into the log.
func (l *RunLog) Apply(env events.Envelope) {
	l.Events++
	l.run.Apply(env.Event)
	switch ev := env.Event.(type) {
	case events.RunStarted:
		if l.Started == nil {
			l.Started = &ev
		}
	case events.Intent:
		l.Intents = append(l.Intents, ev)
	case events.ModelCallResult:
		l.ModelResults = append(l.ModelResults, ev)
	case events.StepCompleted:
		l.Steps = append(l.Steps, ev)
	case events.RunFinished:
		if l.Finished == nil {
			l.Finished = &ev
		}
	case events.Decision:
		l.Decisions = append(l.Decisions, Decision{ID: env.ID, Step: len(l.run.Steps), Call: ev.ResultID, Verdict: ev.Verdict, By: ev.By,
			Note: ev.Note, Arguments: ev.Arguments, Observation: ev.Observation, At: env.Time()})
	}
}

// Fold folds a whole stream into a RunLog.
func Fold(stream []events.Envelope) *RunLog {
	l := new(RunLog)
	for _, env := range stream {
		l.Apply(env)
	}
	return l
}

// Trajectory returns the step records in stream order. The slice is new and
// never nil.
func (l *RunLog) Trajectory() []events.StepRecord {
	return append(make([]events.StepRecord, 0, len(l.run.Steps)), l.run.Steps...)
}

// Result returns the run's result with its steps and usage put back from
// the stream, and false when the run has not finished.
func (l *RunLog) Result() (events.RunResult, bool) {
	r, ok := l.run.Result()
	if ok {
		r.Steps = l.Trajectory()
	}
	return r, ok
}

// Usage sums the token usage of the run's model replies so far (failed
// calls report none and are not counted).
func (l *RunLog) Usage() events.UsageTotals { return l.run.Usage }

// Summarize is a run's index entry (what a store's index keeps for
// listings), folded from its stream with seams.RunInfo.Apply — the fold
// every store applies to each event it writes.
func Summarize(stream []events.Envelope) seams.RunInfo {
	var info seams.RunInfo
	for _, env := range stream {
		if info.Events == 0 {
			info.RunID = events.RunIDOf(env.Event)
		}
		info.Apply(env)
	}
	return info
}
