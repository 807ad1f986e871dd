package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
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

// oldestFirst is the store's run ids in the order they started, from its
// index (no stream is loaded); it reports a failure itself.
func (c *call) oldestFirst(s seams.RunReader) ([]string, bool) {
	infos, err := report.Newest(context.Background(), s)
	if err != nil {
		c.fail("%s", escape(err.Error()))
		return nil, false
	}
	ids := make([]string, 0, len(infos))
	for i := len(infos) - 1; i >= 0; i-- {
		ids = append(ids, infos[i].RunID)
	}
	return ids, true
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
		fmt.Fprintln(tw, "RUN\tSTATUS\tSTEPS\tSTOP REASON\tTOKENS\tSTARTED\tLAST EVENT")
	}
	for _, r := range shown {
		if r.Status == seams.StatusCorrupt {
			corrupt++
		}
		if c.json {
			enc.Encode(r.JSON())
			continue
		}
		reason := string(r.Info.StopReason)
		if reason == "" {
			reason = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", clip(r.Info.RunID, 60), r.Status, r.Info.Steps, reason,
			tokens(r.Usage), stamp(r.Info.FirstEvent), stamp(r.Info.LastEvent))
	}
	tw.Flush()
	if corrupt > 0 {
		fmt.Fprintf(c.stderr, "polyloop-inspect: %s listed corrupt; see verify\n", report.Plural(corrupt, "run"))
		return exitProblem
	}
	return exitOK
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
