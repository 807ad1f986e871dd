// Package projections folds a run's event stream into the views people and
// code read: the RunLog (every record by type), the trajectory
// ([]events.StepRecord), the RunResult, and a Summary for listings.
//
// Every view is a fold: Apply takes one envelope at a time, and folding a
// whole stream gives the same view as applying its events one by one, so a
// live consumer of an EventSink and a reader of a stored stream agree.
// Folds trust their input: they do not judge whether a stream is sound;
// that is package recovery's work, and recovery uses RunLog to do it.
package projections

import (
	"time"

	"github.com/polyloop/polyloop/events"
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

// Status is a run's state as a listing shows it.
type Status string

const (
	// StatusRunning: no RunFinished yet (in progress, or crashed).
	StatusRunning Status = "running"
	// StatusFinished: the stream holds RunFinished.
	StatusFinished Status = "finished"
)

// Summary is a run's line in a listing. It keeps no events, so it can fold
// a long stream in constant memory.
type Summary struct {
	RunID      string
	Status     Status
	Steps      int
	StopReason events.StopReason // empty until finished
	Events     int
	Started    time.Time // time of the first event
	LastEvent  time.Time
}

// Apply folds one envelope into the summary.
func (s *Summary) Apply(env events.Envelope) {
	if s.Events == 0 {
		s.Started = env.Time()
		s.Status = StatusRunning
		s.RunID = events.RunIDOf(env.Event)
	}
	s.Events++
	s.LastEvent = env.Time()
	switch ev := env.Event.(type) {
	case events.StepCompleted:
		s.Steps++
	case events.RunFinished:
		s.Status = StatusFinished
		s.StopReason = ev.Result.StopReason
	}
}

// Summarize folds a whole stream into a Summary.
func Summarize(stream []events.Envelope) Summary {
	var s Summary
	for _, env := range stream {
		s.Apply(env)
	}
	return s
}
