package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/report"
	"github.com/polyloop/polyloop/seams"
)

// runFilter is runs' flags, read into a report.Filter.
type runFilter struct {
	status, stopReason multiFlag
	since              string
	limit              int
	report.Filter
}

func runsFlags(fs *flag.FlagSet, c *call) {
	fs.Var(&c.filter.status, "status", "only runs with this status (repeatable)")
	fs.Var(&c.filter.stopReason, "stop-reason", "only runs that stopped with this reason (repeatable)")
	fs.StringVar(&c.filter.since, "since", "", "only runs started at or after this time or duration ago")
	fs.IntVar(&c.filter.limit, "limit", 0, "at most this many runs (the newest)")
}

// check validates the flags and fills the report filter.
func (f *runFilter) check() error {
	f.Filter = report.Filter{StopReason: f.stopReason, Limit: f.limit}
	for _, s := range f.status {
		f.Status = append(f.Status, seams.RunStatus(s))
	}
	if f.since != "" {
		t, err := report.ParseSince(f.since, time.Now())
		if err != nil {
			return fmt.Errorf("--%w", err)
		}
		f.Since = t
	}
	if err := f.Filter.Check(); err != nil {
		return fmt.Errorf("--%w", err)
	}
	return nil
}

// oldestFirst is the store's listing in the order the runs started, from
// its index (no stream is loaded); it reports a failure itself.
func (c *call) oldestFirst(s seams.RunReader) ([]seams.RunInfo, bool) {
	infos, err := report.Newest(context.Background(), s)
	if err != nil {
		c.fail("%s", escape(err.Error()))
		return nil, false
	}
	slices.Reverse(infos)
	return infos, true
}

// listRuns is the store's runs, newest first, classified; it reports a
// failure itself.
func (c *call) listRuns(s seams.RunReader) ([]report.Run, bool) {
	runs, err := report.List(context.Background(), s)
	if err != nil {
		c.fail("%s", escape(err.Error()))
		return nil, false
	}
	return runs, true
}

func runsCommand(c *call) int {
	s, ok := c.openStore(c.args[0])
	if !ok {
		return exitProblem
	}
	defer s.Close()
	return c.runsOf(s)
}

// runsOf lists the runs of an open store.
func (c *call) runsOf(s seams.RunReader) int {
	all, ok := c.listRuns(s)
	if !ok {
		return exitProblem
	}
	shown := c.filter.Apply(all)
	corrupt := 0
	enc := json.NewEncoder(c.stdout)
	enc.SetEscapeHTML(false)
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	if !c.json {
		fmt.Fprintln(tw, "RUN\tSTATUS\tSTEPS\tTOKENS\tAGENT\tSTARTED\tSTOP REASON / HOLDER")
	}
	for _, r := range shown {
		if r.Status == seams.StatusCorrupt {
			corrupt++
		}
		if c.json {
			enc.Encode(r.JSON())
			continue
		}
		agent := "-"
		if r.Info.Agent != "" {
			agent = clip(r.Info.Agent, 16)
		}
		started := "-"
		if !r.Info.FirstEvent.IsZero() {
			started = report.Clock(r.Info.FirstEvent, r.Now)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", clip(r.Info.RunID, 40), r.Status, r.Info.Steps,
			tokens(r.Usage), agent, started, detail(r))
	}
	tw.Flush()
	if corrupt > 0 {
		fmt.Fprintf(c.stderr, "polyloop-inspect: %s listed corrupt; see verify\n", report.Plural(corrupt, "run"))
		return exitProblem
	}
	return exitOK
}

// A listing line keeps within 120 columns for everyday names: the time a
// run started is given to the second, without the date on the day it is
// listed (report.Clock; --json has every time in full), and its last
// column is detail.

// detail is a listing line's last column: a finished run's stop reason,
// the pending call of a run awaiting a person ("refund call ID", the CALL
// polyloop-admin approve, reject and resolve take), who holds another
// unfinished one (report.Holder: "W until T", "lease of W ran out at T"),
// "-" for a run nobody holds or held (the status says which) and for a
// corrupt one. Only one ever applies, so one column keeps a line within
// 120 columns. A fork's adds where it came from: "; forked from RUN@K"
// (the source's id clipped to 24 runes; --json has it whole).
func detail(r report.Run) string {
	d := state(r)
	if o := r.Lineage.ForkedFrom; o != nil {
		d += fmt.Sprintf("; forked from %s@%d", clip(o.Run, 24), o.Step)
	}
	return d
}

// state is detail but for a fork's origin.
func state(r report.Run) string {
	if r.Info.StopReason != "" && r.Status == seams.StatusFinished {
		return string(r.Info.StopReason)
	}
	if p := r.Verdict.Pending; p != nil && report.AwaitsPerson(r.Status) {
		tool := "action"
		if p.Tool != "" {
			tool = clip(p.Tool, 16)
		}
		return fmt.Sprintf("%s call %s", tool, clip(p.Call, 40))
	}
	info := r.Info
	info.Owner = clip(info.Owner, 24) // escaped, and short enough to leave the time in view
	return report.Holder(r.Status, info, r.Now)
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
