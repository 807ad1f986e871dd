package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/report"
	"github.com/polyloop/polyloop/seams"
)

// decisionFlags are the flags of approve, reject and resolve.
type decisionFlags struct {
	by, note, arguments, observation *string
	executed, notExecuted            *bool
}

// decision is the decision the command line of verb (approve, reject or
// resolve) asks for — f its flags, set the names of those given, pos its
// positional arguments (STORE RUN CALL) — or what is wrong with the
// command line. Who decides is the operator unless --by says.
func decision(verb string, f decisionFlags, set map[string]bool, pos []string) (events.Decision, error) {
	d := events.Decision{By: *f.by, Note: *f.note}
	switch {
	case verb == "approve":
		d.Verdict = events.VerdictApproved
		if set["arguments"] {
			if err := jsonObject(*f.arguments); err != nil {
				return d, fmt.Errorf("--arguments: %w", err)
			}
			d.Arguments = f.arguments
		}
	case verb == "reject":
		d.Verdict = events.VerdictRejected
	case *f.executed == *f.notExecuted:
		return d, errors.New("say what became of the action: --executed --observation TEXT, or --not-executed")
	case *f.executed && !set["observation"]:
		return d, errors.New("--executed needs --observation: what was seen of the action's effect, which the model is told")
	case *f.executed:
		d.Verdict, d.Observation = events.VerdictExecuted, f.observation
	case set["observation"]:
		return d, errors.New("--observation goes with --executed: an action that did not run has no effect to observe")
	default:
		d.Verdict = events.VerdictNotExecuted
	}
	if len(pos) != 3 {
		return d, errors.New("want STORE, RUN and CALL (the id of the call that waits)")
	}
	if d.By == "" {
		d.By = operator()
	}
	d.RunID, d.ResultID = pos[1], pos[2]
	return d, nil
}

// jsonObject says why text is not one JSON object, nil when it is.
func jsonObject(text string) error {
	var v any
	if err := json.Unmarshal([]byte(text), &v); err != nil {
		return fmt.Errorf("%q is not JSON: %v", report.Clip(text, 80), err)
	}
	if _, ok := v.(map[string]any); !ok {
		return fmt.Errorf("%q is not a JSON object", report.Clip(text, 80))
	}
	return nil
}

// decide records d — an approval or rejection (engine.Decide), or an
// operator's finding on an action in doubt (engine.Resolve) — in s and
// says what the run does next. A refusal is said on stderr, its reason in
// words, and makes the exit status 1. verb names the command in
// messages; store names s.
func decide(ctx context.Context, s seams.RunStore, store, verb string, d events.Decision, stdout, stderr io.Writer) int {
	env, err := record(ctx, s, d)
	if err != nil {
		fmt.Fprintf(stderr, "polyloop-admin: %s: %s\n", verb, refusal(err, store, d))
		return exitProblem
	}
	d = env.Event.(events.Decision) // as recorded: edited arguments as they run
	what := "call " + d.ResultID
	if tool := toolOf(ctx, s, d); tool != "" {
		what += " (" + tool + ")"
	}
	var next string
	switch d.Verdict {
	case events.VerdictApproved:
		what += " approved by " + d.By
		if d.Arguments != nil {
			what += ", with arguments " + *d.Arguments
		}
		next = "it runs, once"
	case events.VerdictRejected:
		what += " rejected by " + d.By
		observation := "rejected by reviewer"
		if d.Note != "" {
			observation += ": " + d.Note
		}
		next = fmt.Sprintf("the step completes not executed, the model told %q", observation)
	case events.VerdictExecuted:
		what += " found executed by " + d.By
		next = fmt.Sprintf("the step completes executed without running it again, the model told %q", *d.Observation)
	case events.VerdictNotExecuted:
		what += " found not executed by " + d.By
		next = "the step completes not executed, without running it"
	}
	fmt.Fprintf(stdout, "%s: %s\n  when the run goes on %s; %s\n", d.RunID, what, next, goesOn(ctx, s, d.RunID))
	return exitOK
}

// record records d in s: an approval's answer (approved, rejected) by
// engine.Decide, an operator's finding (executed, not executed) by
// engine.Resolve.
func record(ctx context.Context, s seams.RunStore, d events.Decision) (events.Envelope, error) {
	if d.Verdict.Resolves() {
		return engine.Resolve(ctx, s, d)
	}
	return engine.Decide(ctx, s, d)
}

// goesOn says who continues runID now that it waits for nobody: the
// workers of its agent, to whom Decide handed it back, or whoever resumes
// it.
func goesOn(ctx context.Context, s seams.RunStore, runID string) string {
	if agent := agentOf(ctx, s, runID); agent != "" {
		return "it is handed back to the workers" + agent
	}
	return "the program that runs it resumes it (engine.Resume)"
}

// toolOf is the tool the decided call names in its run's log, "" when
// the log cannot say.
func toolOf(ctx context.Context, s seams.RunStore, d events.Decision) string {
	stream, err := s.Load(ctx, d.RunID)
	if err != nil {
		return ""
	}
	for _, env := range stream {
		if in, ok := env.Event.(events.Intent); ok && in.ResultID == d.ResultID && in.ToolName != "" {
			return in.ToolName
		}
	}
	return ""
}

// refusal says in words why Decide or Resolve refused d (err): the run or
// call is not there, the call does not await this decision (the engine's
// reason: awaiting none, or another, completed, not an action) or is
// decided already, the decision is invalid, a driver holds the run, the
// log is damaged.
func refusal(err error, store string, d events.Decision) string {
	run, call := report.Clip(d.RunID, 80), report.Clip(d.ResultID, 80)
	switch {
	case errors.Is(err, engine.ErrRunNotFound):
		return fmt.Sprintf("no run %q in %s", run, store)
	case errors.Is(err, engine.ErrNoSuchCall):
		return fmt.Sprintf("run %q has no call %q (polyloop-inspect verify STORE RUN names the call that waits)", run, call)
	case errors.Is(err, engine.ErrNotPending):
		return fmt.Sprintf("call %q of run %q: %s", call, run, detail(err, engine.ErrNotPending))
	case errors.Is(err, engine.ErrAlreadyDecided):
		return fmt.Sprintf("call %q of run %q is decided already: %s", call, run, detail(err, engine.ErrAlreadyDecided))
	case errors.Is(err, engine.ErrInvalidDecision):
		return fmt.Sprintf("refused, nothing recorded: %s", detail(err, engine.ErrInvalidDecision))
	case errors.Is(err, engine.ErrRunBusy):
		return fmt.Sprintf("run %q is driven by another process now; nothing recorded, try again once it waits: %v", run, err)
	case errors.Is(err, recovery.ErrCorrupt):
		return fmt.Sprintf("run %q is damaged, nothing recorded (polyloop-inspect verify says how): %v", run, err)
	}
	return err.Error()
}

// detail is what err says after sentinel, the reason a refusal gives;
// all of err when it says nothing after it.
func detail(err, sentinel error) string {
	msg := err.Error()
	i := strings.LastIndex(msg, sentinel.Error()+": ")
	if i < 0 {
		return msg
	}
	return msg[i+len(sentinel.Error())+2:]
}
