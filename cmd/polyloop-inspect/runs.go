package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
)

// runStatus is a run's status for listings, from recovery's verdict.
func runStatus(s seams.RunReader, runID string) (status string, verdict recovery.Verdict, err error) {
	stream, err := s.Load(context.Background(), runID)
	v, err := recovery.ClassifyLoaded(runID, stream, err)
	switch {
	case err != nil:
		return "corrupt", v, err
	case v.State == recovery.Finished:
		return "finished", v, nil
	case v.InDoubt != nil:
		return "in doubt", v, nil
	}
	return "running", v, nil
}

func runsCommand(w io.Writer, args []string, _ bool) int {
	s, ok := openStore(w, args[0])
	if !ok {
		return exitProblem
	}
	defer s.Close()
	runs, err := s.Runs(context.Background())
	if err != nil {
		fmt.Fprintf(w, "error: %v\n", err)
		return exitProblem
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tSTATUS\tSTEPS\tSTOP REASON\tSTARTED\tLAST EVENT")
	for _, r := range runs {
		status, _, _ := runStatus(s, r.RunID)
		reason := string(r.StopReason)
		if reason == "" {
			reason = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", escape(r.RunID), status, r.Steps, reason, stamp(r.FirstEvent), stamp(r.LastEvent))
	}
	tw.Flush()
	return exitOK
}
