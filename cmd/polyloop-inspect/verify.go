package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/report"
	"github.com/polyloop/polyloop/seams"
)

func verifyCommand(c *call) int {
	s, ok := c.openStore(c.args[0])
	if !ok {
		return exitProblem
	}
	defer s.Close()
	var ids []string
	if len(c.args) == 2 {
		ids = []string{c.args[1]}
	} else {
		if ids, ok = c.oldestFirst(s); !ok { // as they happened
			return exitProblem
		}
	}
	enc := json.NewEncoder(c.stdout)
	enc.SetEscapeHTML(false)
	corrupt := 0
	for _, id := range ids {
		stream, err := s.Load(context.Background(), id)
		if err == nil && len(stream) == 0 {
			return c.fail("no run %q in %s", clip(id, 80), c.store())
		}
		v, err := recovery.ClassifyLoaded(id, stream, err)
		if err != nil {
			corrupt++
		}
		if c.json {
			enc.Encode(report.Verdict(id, stream, v, err))
		} else {
			printVerdict(c, id, stream, v, err)
		}
	}
	if c.json {
		if corrupt > 0 {
			return exitProblem
		}
		return exitOK
	}
	if corrupt > 0 {
		fmt.Fprintf(c.stdout, "%d corrupt of %s\n", corrupt, report.Plural(len(ids), "run"))
		return exitProblem
	}
	fmt.Fprintln(c.stdout, "OK")
	return exitOK
}

func printVerdict(c *call, id string, stream []events.Envelope, v recovery.Verdict, err error) {
	w := c.stdout
	defer func() {
		for _, e := range report.EnvErrors(stream) {
			fmt.Fprintf(w, "  env_error in step %d: %s\n", e.Step, clip(e.Cause, 200))
		}
	}()
	if err != nil {
		reasons := report.Problems(err)
		fmt.Fprintf(w, "%s: corrupt (%s)\n", clip(id, 80), report.Plural(len(reasons), "problem"))
		for _, r := range reasons {
			fmt.Fprintf(w, "  - %s\n", escape(r))
		}
		return
	}
	switch v.State {
	case recovery.Finished:
		fmt.Fprintf(w, "%s: finished (%s, %s)\n", clip(id, 80), v.Result.StopReason, report.Plural(len(v.Result.Steps), "step"))
		if a := v.Result.FinalAnswer; a != nil {
			fmt.Fprintf(w, "  answer: %s\n", clip(*a, 200))
		}
		return
	case recovery.BetweenSteps:
		fmt.Fprintf(w, "%s: resumable before step %d: %s\n", clip(id, 80), v.Step, v.Plan.Describe())
		return
	}
	fmt.Fprintf(w, "%s: resumable in step %d at %s: %s\n", clip(id, 80), v.Step, v.State, v.Plan.Describe())
	if in := v.InDoubt; in != nil {
		tool := "-"
		if in.ToolName != "" {
			tool = escape(in.ToolName)
		} else if in.IntentKind == events.IntentAction {
			tool = "(tool-less action)"
		}
		fmt.Fprintf(w, "  in doubt: step %d, %s, tool %s, result id %s, replay policy %s -> %s\n",
			in.CallIndex, in.IntentKind, tool, escape(in.ResultID), in.ReplayPolicy, v.Plan.Describe())
	}
}

// loadRun opens the store and loads one run, reporting a failure itself.
func (c *call) loadRun(target, runID string) ([]events.Envelope, bool) {
	s, ok := c.openStore(target)
	if !ok {
		return nil, false
	}
	defer s.Close()
	return c.load(s, runID)
}

func (c *call) load(s seams.RunReader, runID string) ([]events.Envelope, bool) {
	stream, err := s.Load(context.Background(), runID)
	if err != nil {
		c.fail("%s", clip(err.Error(), 2000))
		return nil, false
	}
	if len(stream) == 0 {
		c.fail("no run %q in %s", clip(runID, 80), c.store())
		return nil, false
	}
	return stream, true
}
