// Package projections folds a run's event stream into the views people and
// code read: the RunLog (every record by type), the trajectory
// ([]events.StepRecord), the RunResult, the usage, and the index entry a store keeps (Summarize).
//
// Every view is a fold: Apply takes one envelope at a time, and folding a
// whole stream gives the same view as applying its events one by one, so a
// live consumer of an EventSink and a reader of a stored stream agree.
// Folds trust their input: they do not judge whether a stream is sound;
// that is package recovery's work, and recovery uses RunLog to do it.
package projections

import (
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// RunLog holds a stream's records by type, in stream order.
type RunLog struct {
	Started      *events.RunStarted
	Intents      []events.Intent
	ModelResults []events.ModelCallResult
	Steps        []events.StepCompleted
	Finished     *events.RunFinished
	// Events counts every envelope applied, including any the fold ignored.
	Events int
}

// Apply folds one envelope into the log.
func (l *RunLog) Apply(env events.Envelope) {
	l.Events++
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
	out := make([]events.StepRecord, len(l.Steps))
	for i, s := range l.Steps {
		out[i] = s.Step
	}
	return out
}

// Result returns the run's result with its steps and usage put back from
// the stream, and false when the run has not finished.
func (l *RunLog) Result() (events.RunResult, bool) {
	if l.Finished == nil {
		return events.RunResult{}, false
	}
	r := l.Finished.Result
	usage := l.Usage()
	r.Steps, r.Usage = l.Trajectory(), &usage
	return r, true
}

// Usage sums the token usage of the run's model replies so far (failed
// calls report none and are not counted).
func (l *RunLog) Usage() events.UsageTotals {
	var t events.UsageTotals
	for _, r := range l.ModelResults {
		if r.Reply != nil {
			t.Add(r.Reply.Usage)
		}
	}
	return t
}

// Summarize is a run's index entry (what a store's index keeps for
// listings), folded from its stream with seams.RunInfo.Observe — the fold
// every store applies to each event it writes.
func Summarize(stream []events.Envelope) seams.RunInfo {
	var info seams.RunInfo
	for _, env := range stream {
		if info.Events == 0 {
			info.RunID = events.RunIDOf(env.Event)
		}
		info.Observe(env)
	}
	return info
}
