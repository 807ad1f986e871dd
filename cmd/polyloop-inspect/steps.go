package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/polyloop/polyloop/projections"
)

func stepsCommand(w io.Writer, args []string, asJSON bool) int {
	stream, ok := loadRun(w, args[0], args[1])
	if !ok {
		return exitProblem
	}
	steps := projections.Fold(stream).Trajectory()
	if asJSON {
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
	fmt.Fprintln(tw, "STEP\tPARSE\tACTION\tTOOL\tSTATUS\tPROMPT\tWALL MS\tOBSERVATION")
	for _, s := range steps {
		parse := "ok"
		if !s.ParseOK {
			parse = "failed"
		}
		status := "-"
		if s.ActionStatus != nil {
			status = string(*s.ActionStatus)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", s.StepIdx, parse, str(s.Action), str(s.ToolName), status,
			s.PromptChars, s.StepWallMs, clip(s.Observation, 50))
	}
	tw.Flush()
	return exitOK
}
