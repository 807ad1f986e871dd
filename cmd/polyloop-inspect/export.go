package main

import (
	"bytes"
	"encoding/json"
	"flag"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/projections"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
)

func exportFlags(fs *flag.FlagSet, c *call) {
	fs.Var(&c.runs, "run", "export this run (repeatable; default: every run)")
}

// exportCommand prints one JSON Lines table of the steps of many runs: each
// row the StepRecord's eighteen fields with run_id first, and, in a fork's
// rows of the steps it copied, copied_from: the run the step first ran in. A run that cannot
// be loaded, is not in the store or is corrupt is reported on standard
// error and the others are exported; the exit status is then 1.
func exportCommand(c *call) int {
	s, ok := c.openStore(c.args[0])
	if !ok {
		return exitProblem
	}
	defer s.Close()
	return c.exportIn(s)
}

// exportIn exports the runs of an open store.
func (c *call) exportIn(s seams.RunReader) int {
	ids := []string(c.runs)
	if len(ids) == 0 {
		infos, ok := c.oldestFirst(s)
		if !ok {
			return exitProblem
		}
		for _, info := range infos {
			ids = append(ids, info.RunID)
		}
	}
	code := exitOK
	for _, id := range ids {
		stream, ok := c.load(s, id) // a run that cannot be loaded is reported, the others exported
		if !ok {
			code = exitProblem
			continue
		}
		if err := recovery.Check(id, stream); err != nil {
			c.fail("run %q is corrupt, not exported (see verify): %s", clip(id, 80), clip(err.Error(), 2000))
			code = exitProblem
			continue
		}
		prefix, err := json.Marshal(id)
		if err != nil {
			return c.fail("run id %q: %v", clip(id, 80), err)
		}
		var origin *events.ForkOrigin
		if started, ok := stream[0].Event.(events.RunStarted); ok {
			origin = started.Fork
		}
		for _, step := range projections.Fold(stream).Trajectory() {
			var row bytes.Buffer
			enc := json.NewEncoder(&row)
			enc.SetEscapeHTML(false)
			if err := enc.Encode(step); err != nil {
				return c.fail("run %q step %d: %v", clip(id, 80), step.StepIdx, err)
			}
			// {"step_idx":… becomes {"run_id":"…","step_idx":…
			c.stdout.Write([]byte(`{"run_id":`))
			c.stdout.Write(prefix)
			c.stdout.Write([]byte(","))
			if origin != nil && step.StepIdx < origin.Step {
				from, _ := json.Marshal(origin.RunOfStep(step.StepIdx))
				c.stdout.Write([]byte(`"copied_from":`))
				c.stdout.Write(from)
				c.stdout.Write([]byte(","))
			}
			c.stdout.Write(row.Bytes()[1:])
		}
	}
	return code
}
