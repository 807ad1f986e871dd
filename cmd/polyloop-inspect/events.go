package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/report"
	"github.com/polyloop/polyloop/seams"
)

func eventsFlags(fs *flag.FlagSet, c *call) {
	fs.BoolVar(&c.follow, "follow", false, "keep printing new events until the run finishes")
}

func eventsCommand(c *call) int {
	w := c.stdout
	if c.follow {
		ctx, stop := interruptCtx()
		defer stop()
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false)
		return c.followRun(ctx, c.args[1], func(env events.Envelope) {
			if c.json {
				enc.Encode(report.Event(env))
				return
			}
			fmt.Fprintf(w, "%s  %s  %-17s  %s\n", env.ID, stamp(env.Time()), env.Kind, summary(env.Event))
		})
	}
	s, ok := c.openStore(c.args[0])
	if !ok {
		return exitProblem
	}
	defer s.Close()
	return c.eventsIn(s, c.args[1])
}

// eventsIn prints the events of run runID of an open store.
func (c *call) eventsIn(s seams.RunReader, runID string) int {
	w := c.stdout
	stream, ok := c.load(s, runID)
	if !ok {
		return exitProblem
	}
	if c.json {
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false)
		for _, env := range stream {
			enc.Encode(report.Event(env))
		}
		return exitOK
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTIME\tKIND\tSUMMARY")
	for _, env := range stream {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", env.ID, stamp(env.Time()), env.Kind, summary(env.Event))
	}
	tw.Flush()
	if p := pendingOf(runID, stream); p != nil {
		fmt.Fprintln(w, "the run waits for a person:")
		c.printPending(w, runID, *p, "  ")
	}
	forks, ok := c.forksIn(s)
	if !ok {
		return exitProblem
	}
	printLineage(w, lineageOf(s, runID, stream, forks), "")
	return exitOK
}

// summary is one line about an event, escaped.
func summary(ev events.Event) string {
	switch e := ev.(type) {
	case events.RunStarted:
		s := fmt.Sprintf("run %s, %d parameters", escape(e.RunID), len(e.ParameterSnapshot))
		if o := e.Fork; o != nil {
			s += ", " + report.Origin(*o, func(id string) string { return clip(id, 40) })
		}
		return s
	case events.Intent:
		s := fmt.Sprintf("%s step %d, result %s, policy %s", e.IntentKind, e.CallIndex, escape(e.ResultID), e.ReplayPolicy)
		if e.ToolName != "" {
			s += ", tool " + escape(e.ToolName)
		}
		if e.Awaits != "" {
			s += ", awaits " + string(e.Awaits)
			if e.Arguments != "" {
				s += ", arguments " + clip(e.Arguments, 60)
			}
		}
		return s
	case events.Decision:
		return decisionSummary(e)
	case events.ModelCallResult:
		if e.Failure != nil {
			return fmt.Sprintf("result %s: failure %s", escape(e.ResultID), clip(*e.Failure, 60))
		}
		return fmt.Sprintf("result %s: reply \"%s\"", escape(e.ResultID), clip(e.Reply.Content, 60))
	case events.StepCompleted:
		s := e.Step
		status := "no action"
		if s.ActionStatus != nil {
			status = string(*s.ActionStatus)
		}
		if !s.ParseOK && s.ParseError != nil {
			status = "parse failed"
		}
		return fmt.Sprintf("step %d: %s, observation \"%s\"", s.StepIdx, status, clip(s.Observation, 50))
	case events.RunFinished:
		r := fmt.Sprintf("stop %s", e.Result.StopReason)
		if e.Result.FinalAnswer != nil {
			r += fmt.Sprintf(", answer \"%s\"", clip(*e.Result.FinalAnswer, 50))
		}
		return r
	}
	return ""
}

// decisionSummary is one line about a person's decision: on which call,
// the verdict and who, then the note, an approval's edited arguments and
// a finding's observation where there are.
func decisionSummary(d events.Decision) string {
	verdict := string(d.Verdict)
	if d.Verdict.Resolves() {
		verdict = "found " + strings.ReplaceAll(verdict, "_", " ")
	}
	s := fmt.Sprintf("call %s %s by %s", escape(d.ResultID), verdict, clip(d.By, 40))
	if d.Note != "" {
		s += fmt.Sprintf(", note \"%s\"", clip(d.Note, 60))
	}
	if d.Arguments != nil {
		s += ", arguments " + clip(*d.Arguments, 60)
	}
	if d.Observation != nil {
		s += fmt.Sprintf(", observation \"%s\"", clip(*d.Observation, 60))
	}
	return s
}
