package main

import (
	"context"
	"encoding/json"
	"errors"
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
	return c.verifyIn(s)
}

// verifyIn verifies the runs (or the run) of an open store.
func (c *call) verifyIn(s seams.RunReader) int {
	ctx := context.Background()
	ok := true
	var infos []seams.RunInfo
	if len(c.args) == 2 {
		info, err := report.Describe(ctx, s, c.args[1])
		switch {
		case errors.Is(err, seams.ErrNoRun) || errors.Is(err, events.ErrCorruption):
			// Its stream says whether it is there, and what is damaged.
			info = seams.RunInfo{RunID: c.args[1]}
		case err != nil:
			return c.fail("%s", clip(err.Error(), 2000))
		}
		infos = []seams.RunInfo{info}
	} else {
		if infos, ok = c.oldestFirst(s); !ok { // as they happened
			return exitProblem
		}
	}
	forks, ok := c.forksIn(s)
	if !ok {
		return exitProblem
	}
	enc := json.NewEncoder(c.stdout)
	enc.SetEscapeHTML(false)
	corrupt := 0
	for _, info := range infos {
		stream, err := s.Load(ctx, info.RunID)
		if err == nil && len(stream) == 0 {
			return c.fail("no run %q in %s", clip(info.RunID, 80), c.store())
		}
		r := report.Classify(info, stream, err)
		report.Trace(ctx, s, &r, forks)
		if r.Err != nil {
			corrupt++
		}
		if c.json {
			enc.Encode(report.Verdict(r, stream))
		} else {
			printVerdict(c, r, stream)
			printLineage(c.stdout, r.Lineage, "  ")
		}
	}
	if c.json {
		if corrupt > 0 {
			return exitProblem
		}
		return exitOK
	}
	if corrupt > 0 {
		fmt.Fprintf(c.stdout, "%d corrupt of %s\n", corrupt, report.Plural(len(infos), "run"))
		return exitProblem
	}
	fmt.Fprintln(c.stdout, "OK")
	return exitOK
}

// printVerdict prints r's verdict: finished with its answer; corrupt with
// every reason; for an unfinished run its status, where its log stops and
// who drives it — and, for a run nobody holds, what Resume would do and the
// side effect in doubt (a run a driver holds is in a call, not in doubt),
// with the commands that settle an action in doubt (report.Run.Decidable);
// for a run awaiting a person, the pending call and the commands that
// decide it.
func printVerdict(c *call, r report.Run, stream []events.Envelope) {
	w, id, v := c.stdout, clip(r.Info.RunID, 80), r.Verdict
	defer func() {
		for _, e := range report.EnvErrors(stream) {
			fmt.Fprintf(w, "  env_error in step %d: %s\n", e.Step, clip(e.Cause, 200))
		}
	}()
	if r.Err != nil {
		reasons := report.Problems(r.Err)
		fmt.Fprintf(w, "%s: corrupt (%s)\n", id, report.Plural(len(reasons), "problem"))
		for _, reason := range reasons {
			fmt.Fprintf(w, "  - %s\n", escape(reason))
		}
		return
	}
	switch {
	case v.State == recovery.Finished:
		fmt.Fprintf(w, "%s: finished (%s, %s)\n", id, v.Result.StopReason, report.Plural(len(v.Result.Steps), "step"))
		if a := v.Result.FinalAnswer; a != nil {
			fmt.Fprintf(w, "  answer: %s\n", clip(*a, 200))
		}
		return
	case r.Status.Held() && v.State == recovery.BetweenSteps:
		fmt.Fprintf(w, "%s: running, before step %d\n", id, v.Step)
	case r.Status.Held():
		fmt.Fprintf(w, "%s: running, in step %d\n", id, v.Step)
	case report.AwaitsPerson(r.Status):
		fmt.Fprintf(w, "%s: %s in step %d: %s\n", id, r.Status, v.Step, v.Plan.Describe())
	case v.State == recovery.BetweenSteps:
		fmt.Fprintf(w, "%s: %s, resumable before step %d: %s\n", id, r.Status, v.Step, v.Plan.Describe())
	default:
		fmt.Fprintf(w, "%s: %s, resumable in step %d at %s: %s\n", id, r.Status, v.Step, v.State, v.Plan.Describe())
	}
	fmt.Fprintf(w, "  %s\n", escape(r.Liveness()))
	if p := v.Pending; p != nil {
		c.printPending(w, r.Info.RunID, *p, "  ")
		return
	}
	if in := v.InDoubt; in != nil && !r.Status.Held() {
		tool := "-"
		if in.ToolName != "" {
			tool = escape(in.ToolName)
		} else if in.IntentKind == events.IntentAction {
			tool = "(tool-less action)"
		}
		fmt.Fprintf(w, "  in doubt: step %d, %s, tool %s, result id %s, replay policy %s -> %s\n",
			in.CallIndex, in.IntentKind, tool, escape(in.ResultID), in.ReplayPolicy, v.Plan.Describe())
	}
	if p := r.Decidable(); p != nil {
		// An action in doubt, instead of what Resume would do with it.
		fmt.Fprintln(w, "  an operator who knows whether it ran may settle it:")
		c.printCommands(w, r.Info.RunID, *p, "    ")
	}
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
