package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/projections"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
)

// Run statuses of listings, from recovery's verdict.
const (
	statusFinished = "finished"
	statusRunning  = "running"
	statusInDoubt  = "in_doubt"
	statusCorrupt  = "corrupt"
)

// runView is one run as runs shows it.
type runView struct {
	info    seams.RunInfo
	usage   events.UsageTotals
	status  string
	verdict recovery.Verdict
	err     error // why the run is corrupt
}

// view loads runID and classifies it.
func view(s seams.RunReader, info seams.RunInfo) runView {
	stream, err := s.Load(context.Background(), info.RunID)
	v, err := recovery.ClassifyLoaded(info.RunID, stream, err)
	r := runView{info: info, verdict: v, err: err, usage: projections.Fold(stream).Usage()}
	switch {
	case err != nil:
		r.status = statusCorrupt
	case v.State == recovery.Finished:
		r.status = statusFinished
	case v.InDoubt != nil:
		r.status = statusInDoubt
	default:
		r.status = statusRunning
	}
	return r
}

// runFilter selects runs for runs.
type runFilter struct {
	status, stopReason multiFlag
	since              string
	limit              int
	sinceTime          time.Time
}

func runsFlags(fs *flag.FlagSet, c *call) {
	fs.Var(&c.filter.status, "status", "only runs with this status (repeatable)")
	fs.Var(&c.filter.stopReason, "stop-reason", "only runs that stopped with this reason (repeatable)")
	fs.StringVar(&c.filter.since, "since", "", "only runs started at or after this time or duration ago")
	fs.IntVar(&c.filter.limit, "limit", 0, "at most this many runs (the newest)")
}

// check validates the filter's values.
func (f *runFilter) check() error {
	for _, s := range f.status {
		if !slices.Contains([]string{statusFinished, statusRunning, statusInDoubt, statusCorrupt}, s) {
			return fmt.Errorf("--status %q: want finished, running, in_doubt or corrupt", s)
		}
	}
	for _, r := range f.stopReason {
		if !events.StopReason(r).Valid() {
			return fmt.Errorf("--stop-reason %q is not a stop reason", r)
		}
	}
	if f.limit < 0 {
		return fmt.Errorf("--limit %d: want a positive number", f.limit)
	}
	if f.since != "" {
		if d, err := time.ParseDuration(f.since); err == nil {
			f.sinceTime = time.Now().Add(-d)
		} else if t, err := time.Parse(time.RFC3339, f.since); err == nil {
			f.sinceTime = t
		} else {
			return fmt.Errorf("--since %q: want an RFC 3339 time (2026-11-30T09:00:00Z) or a duration (24h)", f.since)
		}
	}
	return nil
}

func (f *runFilter) keeps(r runView) bool {
	if len(f.status) > 0 && !slices.Contains(f.status, r.status) {
		return false
	}
	if len(f.stopReason) > 0 && !slices.Contains(f.stopReason, string(r.info.StopReason)) {
		return false
	}
	return f.sinceTime.IsZero() || !r.info.FirstEvent.Before(f.sinceTime)
}

// listRuns is the store's runs, newest first (ties by run id), with their
// status.
func (c *call) listRuns(s seams.RunReader) ([]runView, bool) {
	infos, err := s.Runs(context.Background())
	if err != nil {
		c.fail("%s", escape(err.Error()))
		return nil, false
	}
	slices.SortStableFunc(infos, func(a, b seams.RunInfo) int {
		if n := b.FirstEvent.Compare(a.FirstEvent); n != 0 {
			return n
		}
		return strings.Compare(a.RunID, b.RunID)
	})
	out := make([]runView, 0, len(infos))
	for _, info := range infos {
		out = append(out, view(s, info))
	}
	return out, true
}

// runJSON is a run in runs --json.
type runJSON struct {
	RunID       string             `json:"run_id"`
	Status      string             `json:"status"`
	Steps       int                `json:"steps"`
	Events      int                `json:"events"`
	StopReason  *events.StopReason `json:"stop_reason"`
	Started     *string            `json:"started"`
	LastEvent   *string            `json:"last_event"`
	FinalAnswer *string            `json:"final_answer"`
	Usage       events.UsageTotals `json:"usage"`
}

func runsCommand(c *call) int {
	s, ok := c.openStore(c.args[0])
	if !ok {
		return exitProblem
	}
	defer s.Close()
	all, ok := c.listRuns(s)
	if !ok {
		return exitProblem
	}
	var shown []runView
	for _, r := range all {
		if c.filter.keeps(r) && (c.filter.limit == 0 || len(shown) < c.filter.limit) {
			shown = append(shown, r)
		}
	}
	corrupt := 0
	enc := json.NewEncoder(c.stdout)
	enc.SetEscapeHTML(false)
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	if !c.json {
		fmt.Fprintln(tw, "RUN\tSTATUS\tSTEPS\tSTOP REASON\tTOKENS\tSTARTED\tLAST EVENT")
	}
	for _, r := range shown {
		if r.status == statusCorrupt {
			corrupt++
		}
		if c.json {
			j := runJSON{RunID: r.info.RunID, Status: r.status, Steps: r.info.Steps, Events: r.info.Events, Usage: r.usage,
				Started: timeOrNil(r.info.FirstEvent), LastEvent: timeOrNil(r.info.LastEvent)}
			if r.info.StopReason != "" {
				j.StopReason = &r.info.StopReason
			}
			if res := r.verdict.Result; res != nil {
				j.FinalAnswer = res.FinalAnswer
			}
			enc.Encode(j)
			continue
		}
		reason := string(r.info.StopReason)
		if reason == "" {
			reason = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", clip(r.info.RunID, 60), r.status, r.info.Steps, reason,
			tokens(r.usage), stamp(r.info.FirstEvent), stamp(r.info.LastEvent))
	}
	tw.Flush()
	if corrupt > 0 {
		fmt.Fprintf(c.stderr, "polyloop-inspect: %s listed corrupt; see verify\n", plural(corrupt, "run"))
		return exitProblem
	}
	return exitOK
}

// timeOrNil is t as JSON shows times (UTC, milliseconds), nil when zero.
func timeOrNil(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := stamp(t)
	return &s
}

// tokens is a run's token total for a table: "-" when no call reported
// any, a "+" when some calls reported none.
func tokens(u events.UsageTotals) string {
	if u.Calls == u.CallsWithoutUsage {
		return "-"
	}
	s := fmt.Sprint(u.Total())
	if u.CallsWithoutUsage > 0 {
		s += "+"
	}
	return s
}
