package kv

import (
	"time"

	"github.com/polyloop/polyloop/events"
)

// Status is a run's state as the index knows it.
type Status string

const (
	// StatusRunning: the stream has no RunFinished (the run is in progress,
	// or crashed and may be resumed).
	StatusRunning Status = "running"
	// StatusFinished: the stream ends with RunFinished.
	StatusFinished Status = "finished"
)

// RunInfo is a run's index entry, maintained in the transaction of every
// append so listings need not scan streams.
type RunInfo struct {
	RunID      string            `msgpack:"run_id"`
	Status     Status            `msgpack:"status"`
	Steps      int               `msgpack:"steps"`
	Events     int               `msgpack:"events"`
	StopReason events.StopReason `msgpack:"stop_reason"`
	FirstEvent time.Time         `msgpack:"first_event"`
	LastEvent  time.Time         `msgpack:"last_event"`
}

func (r *RunInfo) observe(env events.Envelope) {
	if r.Events == 0 {
		r.FirstEvent = env.Time()
	}
	r.Events++
	r.LastEvent = env.Time()
	switch ev := env.Event.(type) {
	case events.StepCompleted:
		r.Steps++
	case events.RunFinished:
		r.Status = StatusFinished
		r.StopReason = ev.Result.StopReason
	}
}
