package main

import (
	"fmt"
	"io"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/report"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/stores"
)

// printPending prints the call runID awaits a person for: what waits
// (approval, or an operator's finding on an action in doubt) and since
// when, the step, tool, call id and arguments, then the polyloop-admin
// commands that decide it, each line indented by indent.
func (c *call) printPending(w io.Writer, runID string, p recovery.PendingCall, indent string) {
	what := "approval"
	if p.Awaits == events.AwaitsResolution {
		what = "an operator's finding (the action may or may not have run)"
	}
	tool := "a tool-less action"
	if p.Tool != "" {
		tool = "tool " + escape(p.Tool)
	}
	fmt.Fprintf(w, "%sawaits %s since %s: step %d, %s, call %s\n", indent, what, stamp(p.Since), p.Step, tool, escape(p.Call))
	if p.Arguments != "" {
		fmt.Fprintf(w, "%s  arguments: %s\n", indent, clip(p.Arguments, 500))
	}
	c.printCommands(w, runID, p, indent+"  ")
}

// printCommands prints the polyloop-admin commands that decide p, a call
// of runID, each line indented by indent.
func (c *call) printCommands(w io.Writer, runID string, p recovery.PendingCall, indent string) {
	cmds := report.DecisionCommands(stores.Describe(c.args[0]), runID, p)
	for i := range cmds {
		cmds[i].Line = escape(cmds[i].Line)
	}
	report.WriteDecisionCommands(w, indent, cmds)
}

// pendingOf is the call stream's run awaits a person for, nil when none.
func pendingOf(runID string, stream []events.Envelope) *recovery.PendingCall {
	return report.Classify(seams.RunInfo{RunID: runID}, stream, nil).Verdict.Pending
}
