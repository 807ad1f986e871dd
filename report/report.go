// Package report is what PolyLoop's readers say about runs — the
// polyloop-inspect command and the run viewer: a run's listing status
// (a seams.RunStatus) from recovery's verdict and the store's word on who
// holds the run (Status: a run a live driver holds is running whatever
// its log's tail; only a run nobody holds is in doubt), who drives a run
// in words (Holder, Liveness), filters over listings, the JSON shapes
// both print (the same names in `polyloop-inspect … --json` and the
// viewer's endpoints; a run awaiting a person carries its pending call,
// PendingJSON; every run its Lineage — the run it was forked from, and
// the runs forked from it, FindForks reading each run's first event), the call a person may decide now (Run.Decidable) and the
// polyloop-admin lines that decide it (DecisionCommands), and the
// Follower both follow a run with, which
// says when nobody drives the run it follows. It reads through
// seams.RunReader (and seams.RunDescriber where a store is one), never a
// particular store.
//
// What does not live here: rendering (text tables in cmd/polyloop-inspect,
// HTML in package viewer) and the verdicts themselves (package recovery).
package report

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/projections"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
)

// Run is one run as a listing shows it.
type Run struct {
	// Info is the run's entry: the loaded stream's summary, with what the
	// store's listing said of its holder and queue.
	Info    seams.RunInfo
	Status  seams.RunStatus // Status of Info, Verdict and Err when classified
	Verdict recovery.Verdict
	Err     error // why the run is corrupt
	Usage   events.UsageTotals
	Now     time.Time // when it was classified: the moment its liveness is of
	// Lineage is where the run was forked from (its RunStarted's, as
	// Classify folds it) and, once a listing (List) or a reader (Trace)
	// looked, the runs forked from it.
	Lineage Lineage
}

// Classify is the run whose listing entry is info, from its loaded
// stream. Every figure of the run is the stream's: its entry is the
// stream's summary (projections.Summarize) under info's run id, so a run
// an agent wrote to after its index entry was read is described as the
// loaded stream shows it, never as the index's counts beside the stream's
// usage and verdict. (A damaged run's figures are those of the events that
// decoded; info stands only when none did.) Who holds the run, and its
// place in the workers' queue, are info's: only the store knows them.
func Classify(info seams.RunInfo, stream []events.Envelope, loadErr error) Run {
	if len(stream) > 0 {
		id := info.RunID
		info = withCoordination(projections.Summarize(stream), info)
		info.RunID = id
	}
	c := recovery.NewClassifier(info.RunID)
	for _, env := range stream {
		c.Apply(env)
	}
	v, err := c.Verdict(loadErr)
	r := Classified(info, v, err, c.Fold().Usage)
	r.Lineage.ForkedFrom = c.Fold().Fork
	return r
}

// Classified is Classify for a caller that has classified and folded the
// stream already (recovery.ClassifyLoaded's v and err, the fold's usage);
// its status is Status's now.
func Classified(info seams.RunInfo, v recovery.Verdict, err error, usage events.UsageTotals) Run {
	now := time.Now()
	return Run{Info: info, Verdict: v, Err: err, Usage: usage, Status: Status(info, v, err, now), Now: now}
}

// Holder is Holder of r when it was classified.
func (r Run) Holder() string { return Holder(r.Status, r.Info, r.Now) }

// Liveness is Liveness of r when it was classified.
func (r Run) Liveness() string { return Liveness(r.Status, r.Info, r.Now) }

// List is every run of the store, newest first (by first event; ties by
// run id), classified, with its lineage: the streams it loads say which
// runs are forks of which, and what each source did from each step on,
// so a listing's lineage costs no further read.
func List(ctx context.Context, s seams.RunReader) ([]Run, error) {
	infos, err := Newest(ctx, s)
	if err != nil {
		return nil, err
	}
	out := make([]Run, 0, len(infos))
	never := map[string][]int{}
	for _, info := range infos {
		stream, err := s.Load(ctx, info.RunID)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err == nil {
			never[info.RunID] = neverFrom(stream)
		}
		out = append(out, Classify(info, stream, err))
	}
	linkForks(out, never)
	return out, nil
}

// Newest is the store's index, newest run first (by first event; ties by
// run id), without loading any stream: the order List classifies in.
func Newest(ctx context.Context, s seams.RunReader) ([]seams.RunInfo, error) {
	infos, err := s.Runs(ctx)
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(infos, func(a, b seams.RunInfo) int {
		if n := b.FirstEvent.Compare(a.FirstEvent); n != 0 {
			return n
		}
		return strings.Compare(a.RunID, b.RunID)
	})
	return infos, nil
}

// Filter selects runs of a listing; the zero value keeps every run.
type Filter struct {
	Status     []seams.RunStatus // any of these statuses
	StopReason []string          // any of these stop reasons
	Since      time.Time
	Limit      int // at most this many (the first, i.e. newest); 0: all
}

// ParseSince reads a --since value: an RFC 3339 time, or a duration before
// now.
func ParseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("since %q: want an RFC 3339 time (2026-11-30T09:00:00Z) or a duration (24h)", s)
}

// Check reports a filter value that can never match.
func (f Filter) Check() error {
	var errs []error
	for _, s := range f.Status {
		if !slices.Contains(seams.RunStatuses, s) {
			errs = append(errs, fmt.Errorf("status %q: want %s", s, statusList()))
		}
	}
	for _, r := range f.StopReason {
		if !events.StopReason(r).Valid() {
			errs = append(errs, fmt.Errorf("stop reason %q is not a stop reason", r))
		}
	}
	if f.Limit < 0 {
		errs = append(errs, fmt.Errorf("limit %d: want a positive number", f.Limit))
	}
	return errors.Join(errs...)
}

// statusList is seams.RunStatuses in words: "finished, running, … or
// corrupt".
func statusList() string {
	var b strings.Builder
	for i, s := range seams.RunStatuses {
		switch {
		case i == len(seams.RunStatuses)-1:
			b.WriteString(" or ")
		case i > 0:
			b.WriteString(", ")
		}
		b.WriteString(string(s))
	}
	return b.String()
}

// Apply is the runs f keeps, in order.
func (f Filter) Apply(runs []Run) []Run {
	var out []Run
	for _, r := range runs {
		if f.Limit > 0 && len(out) == f.Limit {
			break
		}
		if len(f.Status) > 0 && !slices.Contains(f.Status, r.Status) ||
			len(f.StopReason) > 0 && !slices.Contains(f.StopReason, string(r.Info.StopReason)) ||
			!f.Since.IsZero() && r.Info.FirstEvent.Before(f.Since) {
			continue
		}
		out = append(out, r)
	}
	return out
}

// Plural is "1 step", "2 steps".
func Plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// Clip is s shortened to at most n runes, its end marked "…": how the
// readers keep an id or a text a run holds to a line.
func Clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// Stamp is a time as readers print it: UTC, milliseconds; "-" when zero.
func Stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

func stampOrNil(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := Stamp(t)
	return &s
}

// RunJSON is a run in listings' JSON.
type RunJSON struct {
	RunID       string             `json:"run_id"`
	Status      seams.RunStatus    `json:"status"`
	Steps       int                `json:"steps"`
	Events      int                `json:"events"`
	StopReason  *events.StopReason `json:"stop_reason"`
	Started     *string            `json:"started"`
	LastEvent   *string            `json:"last_event"`
	FinalAnswer *string            `json:"final_answer"`
	Usage       events.UsageTotals `json:"usage"`
	Pending     *PendingJSON       `json:"pending"` // the call awaiting a person, if any
	LivenessJSON
	Lineage
}

// JSON is r's listing JSON.
func (r Run) JSON() RunJSON {
	j := RunJSON{RunID: r.Info.RunID, Status: r.Status, Steps: r.Info.Steps, Events: r.Info.Events, Usage: r.Usage,
		Started: stampOrNil(r.Info.FirstEvent), LastEvent: stampOrNil(r.Info.LastEvent), Pending: PendingOf(r.Verdict.Pending),
		LivenessJSON: LivenessOf(r.Info), Lineage: r.Lineage}
	if r.Info.StopReason != "" {
		reason := r.Info.StopReason
		j.StopReason = &reason
	}
	if res := r.Verdict.Result; res != nil {
		j.FinalAnswer = res.FinalAnswer
	}
	return j
}

// VerdictJSON is a run's verdict in JSON. Plan, PlanText and InDoubt
// say what Resume would do, so they are null for a run a live driver
// holds: its driver continues it, and what its tail shows is a call in
// progress, not a side effect in doubt. Pending is the call awaiting a
// person, whoever holds the run: the log says it waits.
type VerdictJSON struct {
	RunID       string             `json:"run_id"`
	Verdict     string             `json:"verdict"` // the run's status as a verdict words it: finished, corrupt, running, Resumable, awaiting_approval or awaiting_resolution
	Status      seams.RunStatus    `json:"status"`  // the run's listing status (Status)
	State       *recovery.State    `json:"state"`
	Step        *int               `json:"step"`
	Plan        *recovery.Plan     `json:"plan"`
	PlanText    *string            `json:"plan_text"`
	InDoubt     *InDoubtJSON       `json:"in_doubt"`
	Pending     *PendingJSON       `json:"pending"`
	Problems    []string           `json:"problems"`
	StopReason  *events.StopReason `json:"stop_reason"`
	FinalAnswer *string            `json:"final_answer"`
	EnvErrors   []EnvError         `json:"env_errors"`
	Liveness    *string            `json:"liveness"` // who drives an unfinished run, in words (Liveness)
	LivenessJSON
	Lineage // as far as the caller traced it (Trace)
}

// InDoubtJSON is a side effect whose outcome is unknown.
type InDoubtJSON struct {
	Step         int                 `json:"step"`
	Kind         events.IntentKind   `json:"kind"`
	Tool         *string             `json:"tool"`
	ResultID     string              `json:"result_id"`
	ReplayPolicy events.ReplayPolicy `json:"replay_policy"`
}

// EnvError is the stored cause of a step's env_error.
type EnvError struct {
	Step  int    `json:"step"`
	Cause string `json:"cause"`
}

// EnvErrors are the causes of a stream's env_error outcomes.
func EnvErrors(stream []events.Envelope) []EnvError {
	var out []EnvError
	for _, env := range stream {
		if sc, ok := env.Event.(events.StepCompleted); ok && sc.ActionOutcome != nil && sc.ActionOutcome.EnvError != nil {
			out = append(out, EnvError{Step: sc.Step.StepIdx, Cause: *sc.ActionOutcome.EnvError})
		}
	}
	return out
}

// Problems lists why a run is corrupt.
func Problems(err error) []string {
	var ce *recovery.CorruptError
	if errors.As(err, &ce) {
		return ce.Reasons
	}
	return strings.Split(err.Error(), "\n")
}

// Resumable is how a verdict words the statuses of a run nobody holds,
// which Resume continues (awaiting, interrupted, in_doubt); a verdict says
// finished, corrupt, running (a live driver holds the run and continues
// it; Resume would find it busy), awaiting_approval and
// awaiting_resolution (Resume returns at once: the run waits for a
// person's decision) as the statuses do.
const Resumable = "resumable"

// verdictOf is status as a verdict words it.
func verdictOf(status seams.RunStatus) string {
	if status.Resumable() && !status.Held() {
		return Resumable
	}
	return string(status)
}

// Verdict is the verdict JSON of r (Classify), whose stream is stream.
func Verdict(r Run, stream []events.Envelope) VerdictJSON {
	v := r.Verdict
	j := VerdictJSON{RunID: r.Info.RunID, Status: r.Status, Verdict: verdictOf(r.Status), EnvErrors: EnvErrors(stream),
		LivenessJSON: LivenessOf(r.Info), Lineage: r.Lineage}
	if r.Err != nil {
		j.Problems = Problems(r.Err)
		return j
	}
	j.State = &v.State
	if v.State == recovery.Finished {
		plan, text := v.Plan, v.Plan.Describe()
		j.Plan, j.PlanText = &plan, &text
		j.StopReason, j.FinalAnswer = &v.Result.StopReason, v.Result.FinalAnswer
		return j
	}
	j.Step = &v.Step
	j.Pending = PendingOf(v.Pending)
	live := r.Liveness()
	j.Liveness = &live
	if r.Status.Held() {
		return j
	}
	plan, text := v.Plan, v.Plan.Describe()
	j.Plan, j.PlanText = &plan, &text
	if in := v.InDoubt; in != nil {
		d := &InDoubtJSON{Step: in.CallIndex, Kind: in.IntentKind, ResultID: in.ResultID, ReplayPolicy: in.ReplayPolicy}
		if in.ToolName != "" {
			tool := in.ToolName
			d.Tool = &tool
		}
		j.InDoubt = d
	}
	return j
}

// EventJSON is an event in JSON: its envelope and payload.
type EventJSON struct {
	ID            string       `json:"id"`
	Time          string       `json:"time"`
	Kind          events.Kind  `json:"kind"`
	SchemaVersion string       `json:"schema_version"`
	Payload       events.Event `json:"payload"`
}

// Event is env's JSON.
func Event(env events.Envelope) EventJSON {
	return EventJSON{ID: env.ID.String(), Time: Stamp(env.Time()), Kind: env.Kind, SchemaVersion: env.SchemaVersion, Payload: env.Event}
}

// StepTokens is each step's model call usage (nil where the call failed
// or reported none), by step index.
func StepTokens(log *projections.RunLog) []*events.Usage {
	out := make([]*events.Usage, len(log.Steps))
	for i := range out {
		if i < len(log.ModelResults) && log.ModelResults[i].Reply != nil {
			out[i] = log.ModelResults[i].Reply.Usage
		}
	}
	return out
}
