package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/projections"
	"github.com/polyloop/polyloop/report"
	"github.com/polyloop/polyloop/seams"
)

func stepsCommand(c *call) int {
	s, ok := c.openStore(c.args[0])
	if !ok {
		return exitProblem
	}
	defer s.Close()
	return c.stepsIn(s, c.args[1])
}

// stepsIn prints the trajectory of run runID of an open store.
func (c *call) stepsIn(s seams.RunReader, runID string) int {
	stream, ok := c.load(s, runID)
	if !ok {
		return exitProblem
	}
	w := c.stdout
	log := projections.Fold(stream)
	steps := log.Trajectory()
	if c.json {
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false)
		for _, s := range steps {
			enc.Encode(s)
		}
		return exitOK
	}
	str := func(p *string) string {
		if p == nil {
			return "-"
		}
		return clip(*p, 30)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tPARSE\tACTION\tTOOL\tSTATUS\tPROMPT\tTOKENS\tWALL MS\tOBSERVATION")
	perStep := report.StepTokens(log)
	for i, s := range steps {
		var u events.UsageTotals
		if perStep[i] != nil {
			u.Add(perStep[i])
		}
		parse := "ok"
		if !s.ParseOK {
			parse = "failed"
		}
		status := "-"
		if s.ActionStatus != nil {
			status = string(*s.ActionStatus)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%s\n", s.StepIdx, parse, str(s.Action), str(s.ToolName), status,
			s.PromptChars, tokens(u), s.StepWallMs, clip(s.Observation, 50))
	}
	tw.Flush()
	fmt.Fprintf(w, "usage: %s\n", log.Usage())
	for _, e := range report.EnvErrors(stream) {
		fmt.Fprintf(w, "step %d env_error: %s\n", e.Step, clip(e.Cause, 200))
	}
	if p := pendingOf(runID, stream); p != nil {
		fmt.Fprintf(w, "step %d waits for a person:\n", p.Step)
		c.printPending(w, runID, *p, "  ")
	}
	forks, ok := c.forksIn(s)
	if !ok {
		return exitProblem
	}
	printLineage(w, lineageOf(s, runID, stream, forks), "")
	return exitOK
}
