package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/report"
	"github.com/polyloop/polyloop/seams"
)

// forksIn is the forks of the store's runs (report.FindForks: the first
// event of each run of its index); it reports a failure itself.
func (c *call) forksIn(s seams.RunReader) (report.Forks, bool) {
	ctx := context.Background()
	infos, err := s.Runs(ctx)
	if err != nil {
		c.fail("%s", escape(err.Error()))
		return nil, false
	}
	forks, err := report.FindForks(ctx, s, infos)
	if err != nil {
		c.fail("%s", escape(err.Error()))
		return nil, false
	}
	return forks, true
}

// lineageOf is the lineage of the run whose stream is stream, traced in
// s (report.Trace) with forks; it reports nothing itself.
func lineageOf(s seams.RunReader, runID string, stream []events.Envelope, forks report.Forks) report.Lineage {
	r := report.Classify(seams.RunInfo{RunID: runID}, stream, nil)
	report.Trace(context.Background(), s, &r, forks)
	return r.Lineage
}

// printLineage prints l, each line after indent: where the run was
// forked from and what it copied, how its parameters differ from the
// source's, the never actions the source executed that the fork does not
// see; then the runs forked from it. A run that is no fork and has none
// prints nothing.
func printLineage(w io.Writer, l report.Lineage, indent string) {
	id := func(s string) string { return clip(s, 40) }
	if o := l.ForkedFrom; o != nil {
		fmt.Fprintf(w, "%s%s: %s\n", indent, report.Origin(*o, id), report.Copied(*o, id))
		if len(o.Differences) == 0 {
			fmt.Fprintf(w, "%s  parameters as the source's\n", indent)
		}
		for _, d := range o.Differences {
			fmt.Fprintf(w, "%s  differs: %s\n", indent, clip(d, 200))
		}
		if u := l.Unseen(); u != "" {
			fmt.Fprintf(w, "%s%s\n", indent, u)
		}
	}
	if len(l.Forks) > 0 {
		fmt.Fprintf(w, "%sforks: %s\n", indent, forkList(l.Forks))
	}
}

// forkList is "RUN@K, RUN@K": forks as a line names them.
func forkList(forks []report.Fork) string {
	parts := make([]string, len(forks))
	for i, f := range forks {
		parts[i] = fmt.Sprintf("%s@%d", clip(f.Run, 40), f.Step)
	}
	return strings.Join(parts, ", ")
}
