package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/recovery"
)

func verifyCommand(w io.Writer, args []string, _ bool) int {
	s, ok := openStore(w, args[0])
	if !ok {
		return exitProblem
	}
	defer s.Close()
	var ids []string
	if len(args) == 2 {
		ids = []string{args[1]}
	} else {
		runs, err := s.Runs(context.Background())
		if err != nil {
			fmt.Fprintf(w, "error: %v\n", err)
			return exitProblem
		}
		for _, r := range runs {
			ids = append(ids, r.RunID)
		}
	}
	corrupt := 0
	for _, id := range ids {
		stream, err := s.Load(context.Background(), id)
		if err == nil && len(stream) == 0 {
			fmt.Fprintf(w, "%s: no such run\n", escape(id))
			corrupt++
			continue
		}
		v, err := recovery.ClassifyLoaded(id, stream, err)
		if err != nil {
			corrupt++
			reasons := strings.Split(err.Error(), "\n")
			var ce *recovery.CorruptError
			if errors.As(err, &ce) {
				reasons = ce.Reasons
			}
			fmt.Fprintf(w, "%s: corrupt (%d problems)\n", escape(id), len(reasons))
			for _, r := range reasons {
				fmt.Fprintf(w, "  - %s\n", escape(r))
			}
			continue
		}
		printVerdict(w, id, v)
	}
	if corrupt > 0 {
		fmt.Fprintf(w, "%d corrupt of %d runs\n", corrupt, len(ids))
		return exitProblem
	}
	fmt.Fprintln(w, "OK")
	return exitOK
}

func printVerdict(w io.Writer, id string, v recovery.Verdict) {
	switch v.State {
	case recovery.Finished:
		fmt.Fprintf(w, "%s: finished (%s, %d steps)\n", escape(id), v.Result.StopReason, len(v.Result.Steps))
		return
	case recovery.BetweenSteps:
		fmt.Fprintf(w, "%s: resumable before step %d: %s\n", escape(id), v.Step, v.Plan)
		return
	}
	fmt.Fprintf(w, "%s: resumable in step %d at %s: %s\n", escape(id), v.Step, v.State, v.Plan)
	if in := v.InDoubt; in != nil {
		tool := "-"
		if in.ToolName != "" {
			tool = escape(in.ToolName)
		} else if in.IntentKind == events.IntentAction {
			tool = "(tool-less action)"
		}
		fmt.Fprintf(w, "  in doubt: step %d, %s, tool %s, result id %s, replay policy %s -> %s\n",
			in.CallIndex, in.IntentKind, tool, escape(in.ResultID), in.ReplayPolicy, v.Plan)
	}
}
