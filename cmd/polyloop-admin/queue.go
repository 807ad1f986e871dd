package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/report"
	"github.com/polyloop/polyloop/seams"
)

// operator names who cancels when --by does not: user@host.
func operator() string {
	name := os.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if name == "" {
		name = "unknown"
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return name + "@" + host
}

// cancelRuns cancels each run of ids in s (engine.Cancel), recording by as
// who asked, and says per run what came of it: a request the run's driver
// carries out, or the run ended here, with any side effect left in doubt.
// A refusal (a run finished or not in the store, a damaged log) is said on
// stderr and makes the exit status 1. store names s in messages.
func cancelRuns(ctx context.Context, s seams.RunStore, store, by string, ids []string, stdout, stderr io.Writer) int {
	if _, ok := s.(seams.RunCanceller); !ok {
		fmt.Fprintf(stderr, "polyloop-admin: %s keeps no cancel requests (%T is not a seams.RunCanceller): cancel a run in the process that drives it\n", store, s)
		return exitProblem
	}
	code := exitOK
	for _, id := range ids {
		c, err := engine.Cancel(ctx, s, id, by)
		switch {
		case errors.Is(err, engine.ErrRunNotFound):
			fmt.Fprintf(stderr, "polyloop-admin: cancel: no run %q in %s\n", report.Clip(id, 80), store)
		case errors.Is(err, seams.ErrRunFinished):
			fmt.Fprintf(stderr, "polyloop-admin: cancel: run %q has finished; nothing to cancel\n", report.Clip(id, 80))
		case err != nil:
			fmt.Fprintf(stderr, "polyloop-admin: %v\n", err)
		case c.Holder != "":
			fmt.Fprintf(stdout, "%s: cancel requested; %s drives it and ends it before its next side effect\n", id, c.Holder)
			continue
		default:
			fmt.Fprintf(stdout, "%s: cancelled (nobody drove it)\n", id)
			if in := c.InDoubt; in != nil {
				fmt.Fprintf(stdout, "  a side effect stays in doubt: %s\n", inDoubt(*in))
			}
			continue
		}
		code = exitProblem
	}
	return code
}

// inDoubt describes an intent whose outcome nobody knows.
func inDoubt(in events.Intent) string {
	what := fmt.Sprintf("step %d, %s", in.CallIndex, in.IntentKind)
	if in.ToolName != "" {
		what += ", tool " + in.ToolName
	}
	return what + fmt.Sprintf(", result id %s, replay policy %s (it may or may not have happened; cancelling settles nothing about it)", in.ResultID, in.ReplayPolicy)
}

// resumeRuns hands each run of ids back to the workers of s
// (seams.RunQueue.RequeueRun) and says so, or why not: a run not started
// for an agent, held by a live driver, finished, or not in the store —
// each a refusal that makes the exit status 1. store names s in messages.
func resumeRuns(ctx context.Context, s seams.RunStore, store string, ids []string, stdout, stderr io.Writer) int {
	q, ok := s.(seams.RunQueue)
	if !ok {
		fmt.Fprintf(stderr, "polyloop-admin: %s keeps no queue of runs for workers (%T is not a seams.RunQueue): resume a run with engine.Resume\n", store, s)
		return exitProblem
	}
	code := exitOK
	for _, id := range ids {
		err := q.RequeueRun(ctx, id)
		switch {
		case err == nil:
			fmt.Fprintf(stdout, "%s: handed back to the workers%s\n", id, agentOf(ctx, s, id))
			continue
		case errors.Is(err, seams.ErrNoRun):
			fmt.Fprintf(stderr, "polyloop-admin: resume: no run %q in %s\n", report.Clip(id, 80), store)
		case errors.Is(err, seams.ErrRunFinished):
			fmt.Fprintf(stderr, "polyloop-admin: resume: run %q has finished; nothing to resume\n", report.Clip(id, 80))
		case errors.Is(err, seams.ErrNotQueued):
			fmt.Fprintf(stderr, "polyloop-admin: resume: run %q was not started for an agent, so no worker claims it; resume it with engine.Resume in the program that runs it\n", report.Clip(id, 80))
		case errors.Is(err, seams.ErrRunLocked):
			by := ""
			if h := holder(ctx, s, id); h != "" {
				by = " (held by " + h + ")"
			}
			fmt.Fprintf(stderr, "polyloop-admin: resume: run %q is driven already%s\n", report.Clip(id, 80), by)
		default:
			fmt.Fprintf(stderr, "polyloop-admin: %v\n", err)
		}
		code = exitProblem
	}
	return code
}

// agentOf is " of agent A" for a run s describes (seams.RunDescriber) as
// started for A, "" otherwise.
func agentOf(ctx context.Context, s seams.RunStore, runID string) string {
	if d, ok := s.(seams.RunDescriber); ok {
		if info, err := d.Describe(ctx, runID); err == nil && info.Agent != "" {
			return " of agent " + info.Agent
		}
	}
	return ""
}
