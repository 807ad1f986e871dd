package report

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// Lineage is where a run came from and the runs forked from it, in the
// JSON both readers print (runs, verify, the viewer's endpoints).
//
// A fork's first ForkedFrom.Step steps are the source's, copied; what the
// source did from that step on is not in the fork's log. Its never
// actions (events.ReplayNever) happened in the world all the same — a
// payment made, a mail sent — and the fork's model does not see them:
// SourceNeverActions counts them.
type Lineage struct {
	// ForkedFrom is the run's RunStarted.Fork (recovery.Fold.Fork): the
	// source, the step, the key of the last event copied, the parameter
	// differences and, for a fork of a fork, the ancestry; null for a run
	// that is no fork.
	ForkedFrom *events.ForkOrigin `json:"forked_from"`
	// SourceNeverActions is, for a fork, how many never actions the
	// source's log records executed in its steps ForkedFrom.Step and
	// after; null for a run that is no fork, or when the source cannot be
	// read (deleted, damaged).
	SourceNeverActions *int `json:"source_never_actions_after"`
	// Forks are the runs forked from this one, oldest first; null when
	// there are none or nobody looked (a listing looks; see FindForks).
	Forks []Fork `json:"forks"`
}

// Fork is a run forked from another: its id and the step it was forked
// at.
type Fork struct {
	Run  string `json:"run"`
	Step int    `json:"step"`
}

// Forks are a store's forks by source run, each source's oldest first
// (FindForks, or a listing's).
type Forks map[string][]Fork

// NeverActionsFrom is how many actions with replay policy never stream
// records executed (a StepCompleted whose action status is executed) in
// its steps step and after, counting one whose outcome the log leaves in
// doubt (its intent written to execute, its step not completed: it may
// have happened): what a fork at step does not see of them.
func NeverActionsFrom(stream []events.Envelope, step int) int {
	never := map[int]bool{} // step index: its action's intent is never
	n, doubt := 0, -1       // doubt: the step whose never action may be in flight
	for _, env := range stream {
		switch e := env.Event.(type) {
		case events.Intent:
			if e.IntentKind == events.IntentAction {
				never[e.CallIndex] = e.ReplayPolicy == events.ReplayNever
				doubt = -1
				if never[e.CallIndex] && e.Awaits != events.AwaitsApproval {
					doubt = e.CallIndex
				}
			}
		case events.StepCompleted:
			s := e.Step
			doubt = -1
			if s.StepIdx >= step && never[s.StepIdx] && s.ActionStatus != nil && *s.ActionStatus == events.StatusExecuted {
				n++
			}
		}
	}
	if doubt >= step {
		n++
	}
	return n
}

// neverFrom is NeverActionsFrom(stream, k) for every k from 0 to the
// stream's completed steps: what a listing keeps of each run so that its
// forks' counts cost no second read.
func neverFrom(stream []events.Envelope) []int {
	steps := 0
	for _, env := range stream {
		if env.Kind == events.KindStepCompleted {
			steps++
		}
	}
	out := make([]int, steps+1)
	for k := range out {
		out[k] = NeverActionsFrom(stream, k)
	}
	return out
}

// errFirstRead stops a scan after a run's first event.
var errFirstRead = errors.New("report: first event read")

// FirstEvent is the first event of runID's stream, false when it has
// none: one event read where s is a seams.RunScanner (kv, pgstore), the
// whole stream loaded otherwise. Damage is Load's error.
func FirstEvent(ctx context.Context, s seams.RunReader, runID string) (events.Envelope, bool, error) {
	if sc, ok := s.(seams.RunScanner); ok {
		var first events.Envelope
		got := false
		err := sc.Scan(ctx, runID, func(env events.Envelope) error {
			first, got = env, true
			return errFirstRead
		})
		if errors.Is(err, errFirstRead) {
			err = nil
		}
		return first, got, err
	}
	stream, err := s.Load(ctx, runID)
	if len(stream) == 0 {
		return events.Envelope{}, false, err
	}
	return stream[0], true, nil
}

// FindForks is the forks of the store's runs of infos: the index entries
// do not say whether a run is a fork, so it reads each run's first event
// (FirstEvent: one event per run on kv and pgstore) and keeps the runs
// whose RunStarted names a source. A run whose first event cannot be read
// (damaged) is left out: its own verdict says what is wrong. It fails
// only when ctx ends.
func FindForks(ctx context.Context, s seams.RunReader, infos []seams.RunInfo) (Forks, error) {
	type found struct {
		Fork
		source string
		info   seams.RunInfo
	}
	var all []found
	for _, info := range infos {
		env, ok, _ := FirstEvent(ctx, s, info.RunID)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if rs, isStart := env.Event.(events.RunStarted); ok && isStart && rs.Fork != nil {
			all = append(all, found{Fork{Run: info.RunID, Step: rs.Fork.Step}, rs.Fork.Run, info})
		}
	}
	slices.SortStableFunc(all, func(a, b found) int {
		if n := a.info.FirstEvent.Compare(b.info.FirstEvent); n != 0 {
			return n
		}
		return strings.Compare(a.Run, b.Run)
	})
	out := Forks{}
	for _, f := range all {
		out[f.source] = append(out[f.source], f.Fork)
	}
	return out, nil
}

// Trace completes r's lineage for a reader of one run: its forks, from
// forks (FindForks), and — for a fork — the never actions its source
// executed from the fork's step on, from the source's stream (one Load).
// A source that cannot be read leaves that count null.
func Trace(ctx context.Context, s seams.RunReader, r *Run, forks Forks) {
	r.Lineage.Forks = forks[r.Info.RunID]
	o := r.Lineage.ForkedFrom
	if o == nil {
		return
	}
	stream, err := s.Load(ctx, o.Run)
	if err != nil || len(stream) == 0 {
		return
	}
	n := NeverActionsFrom(stream, o.Step)
	r.Lineage.SourceNeverActions = &n
}

// linkForks fills the lineage of a listing's runs from the listing
// itself: each run's forks, and each fork's source's never actions from
// never (each run's neverFrom).
func linkForks(runs []Run, never map[string][]int) {
	forks := Forks{}
	for i := len(runs) - 1; i >= 0; i-- { // runs are newest first: forks oldest first
		if o := runs[i].Lineage.ForkedFrom; o != nil {
			forks[o.Run] = append(forks[o.Run], Fork{Run: runs[i].Info.RunID, Step: o.Step})
		}
	}
	for i := range runs {
		l := &runs[i].Lineage
		l.Forks = forks[runs[i].Info.RunID]
		if o := l.ForkedFrom; o != nil {
			if counts, ok := never[o.Run]; ok && o.Step < len(counts) {
				n := counts[o.Step]
				l.SourceNeverActions = &n
			}
		}
	}
}

// Origin is a fork's origin in words: "forked from RUN at step K", then,
// for a fork of a fork, where the copied steps first ran: "(step 0 first
// ran in RUN0, steps 1–2 in RUN1)". clip makes each run id safe and short
// for the reader's medium.
func Origin(o events.ForkOrigin, clip func(string) string) string {
	s := fmt.Sprintf("forked from %s at step %d", clip(o.Run), o.Step)
	if ranges := Ancestors(o); len(ranges) > 0 {
		parts := make([]string, len(ranges))
		for i, r := range ranges {
			parts[i] = fmt.Sprintf("%s in %s", r.Steps, clip(r.Run))
			if i == 0 {
				parts[i] = fmt.Sprintf("%s first ran in %s", r.Steps, clip(r.Run))
			}
		}
		s += " (" + strings.Join(parts, ", ") + ")"
	}
	return s
}

// AncestorSteps is a range of a fork of a fork's copied steps and the
// ancestor they first ran in: Steps is "step 0" or "steps 1–2".
type AncestorSteps struct {
	Steps string
	Run   string
}

// Ancestors are the ranges of a fork's copied steps that first ran in an
// ancestor of its source (ForkOrigin.Ancestry), oldest first.
func Ancestors(o events.ForkOrigin) []AncestorSteps {
	var out []AncestorSteps
	from := 0
	for _, a := range o.Ancestry {
		out = append(out, AncestorSteps{Steps: stepRange(from, a.Steps), Run: a.Run})
		from = a.Steps
	}
	return out
}

// stepRange is "step 0" or "steps 0–2": the steps from..to-1.
func stepRange(from, to int) string {
	if to-from == 1 {
		return fmt.Sprintf("step %d", from)
	}
	return fmt.Sprintf("steps %d–%d", from, to-1)
}

// Copied is what a fork's log holds of its source, in words: "steps 0–2
// are copied from RUN", "no step is copied" for a fork at step 0.
func Copied(o events.ForkOrigin, clip func(string) string) string {
	switch o.Step {
	case 0:
		return "no step is copied"
	case 1:
		return fmt.Sprintf("step 0 is copied from %s", clip(o.Run))
	}
	return fmt.Sprintf("steps 0–%d are copied from %s", o.Step-1, clip(o.Run))
}

// Unseen is the note on a fork whose source executed never actions from
// its step on: "the source executed N never actions at step K and after
// (not seen by this fork)"; empty when it executed none or the count is
// unknown.
func (l Lineage) Unseen() string {
	if l.ForkedFrom == nil || l.SourceNeverActions == nil || *l.SourceNeverActions == 0 {
		return ""
	}
	return fmt.Sprintf("the source executed %s at step %d and after (not seen by this fork)",
		Plural(*l.SourceNeverActions, "never action"), l.ForkedFrom.Step)
}
