package main

import (
	"fmt"
	"io"
	"regexp"
	"strings"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/report"
	"github.com/polyloop/polyloop/seams"
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
	target := c.decisionTarget(runID, p.Call)
	if p.Awaits == events.AwaitsResolution {
		fmt.Fprintf(w, "%s  it ran:         polyloop-admin resolve --executed --observation TEXT %s\n", indent, target)
		fmt.Fprintf(w, "%s  it did not run: polyloop-admin resolve --not-executed %s\n", indent, target)
		return
	}
	edit := ""
	if p.ArgumentsSchema != "" {
		edit = " [--arguments JSON]"
	}
	fmt.Fprintf(w, "%s  approve: polyloop-admin approve [--note TEXT]%s %s\n", indent, edit, target)
	fmt.Fprintf(w, "%s  reject:  polyloop-admin reject --note TEXT %s\n", indent, target)
}

// printResolvable says how an operator who knows whether the action in
// doubt in (nobody drives its run) ran may settle it, instead of what
// Resume would do with it.
func (c *call) printResolvable(w io.Writer, runID string, in events.Intent, indent string) {
	fmt.Fprintf(w, "%san operator who knows whether it ran may settle it: polyloop-admin resolve (--executed --observation TEXT | --not-executed) %s\n",
		indent, c.decisionTarget(runID, in.ResultID))
}

// decisionTarget is STORE RUN CALL of a polyloop-admin command: the store
// as messages name it (a password masked), run and call ids quoted for a
// shell where they need it; escaped for the terminal.
func (c *call) decisionTarget(runID, call string) string {
	return strings.Join([]string{shellQuote(c.store()), escape(shellQuote(runID)), escape(shellQuote(call))}, " ")
}

// pendingOf is the call stream's run awaits a person for, nil when none.
func pendingOf(runID string, stream []events.Envelope) *recovery.PendingCall {
	return report.Classify(seams.RunInfo{RunID: runID}, stream, nil).Verdict.Pending
}

var plainWord = regexp.MustCompile(`^[A-Za-z0-9_./:@%+=,-]+$`)

// shellQuote is s as one word for a POSIX shell: as it is when nothing in
// it is special, in single quotes otherwise.
func shellQuote(s string) string {
	if plainWord.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
