package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/polyloop/polyloop/cmd/internal/demo"
	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
)

// forkStep reads fork's STEP: a step number, 0 or more.
func forkStep(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("STEP %q: want a step number, 0 or more (the fork copies the source's steps below it)", s)
	}
	return n, nil
}

// forkTurns is the script of a fork at step: the demo's replies for the
// copied steps (never asked again: they are history), then replies from
// step on — the demo's own when replies is empty.
func forkTurns(step int, replies []string) []string {
	turns := make([]string, step, step+len(demo.Replies))
	copy(turns, demo.Replies)
	if len(replies) == 0 && step < len(demo.Replies) {
		replies = demo.Replies[step:]
	}
	return append(turns, replies...)
}

// forkRun forks source at step onto newID under the demo's definition
// (engine.Fork), its model replying replies from step on, and prints the
// fork's run as polyloop-demo prints a run. A run of another agent forks
// all the same, under the demo's agent: its recorded differences say how
// far that is from the source's. A refusal is reported in words, exit
// status 1: the step beyond the source's end, newID taken,
// the source not in the store or corrupt, a store that forks no runs.
func forkRun(ctx context.Context, store seams.RunStore, name, source string, step int, newID string, replies []string, stdout, stderr io.Writer) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "polyloop-admin fork: "+format+"\n", a...)
		return exitProblem
	}
	if _, ok := store.(seams.RunForker); !ok {
		return fail("%s does not fork runs (seams.RunForker)", name)
	}
	folder, err := demo.Folder()
	if err != nil {
		return fail("the demo's sample folder: %v", err)
	}
	defer os.RemoveAll(folder)
	def, req, err := demo.Agent(store, folder, newID, forkTurns(step, replies))
	if err != nil {
		return fail("the demo's agent: %v", err)
	}
	result, err := engine.Fork(ctx, def, req, source, step)
	switch {
	case errors.Is(err, engine.ErrForkStep):
		return fail("run %q has no step %d to fork at (polyloop-inspect steps lists its steps)", source, step)
	case errors.Is(err, engine.ErrRunExists):
		return fail("run %q exists in %s: a fork needs a new run id", newID, name)
	case errors.Is(err, engine.ErrRunNotFound):
		return fail("no run %q in %s", source, name)
	case errors.Is(err, recovery.ErrCorrupt):
		return fail("run %q is corrupt, and a fork copies only a sound log (polyloop-inspect verify says why): %v", source, err)
	case err != nil:
		return fail("%v", err)
	}
	fmt.Fprintf(stdout, "forked %s from %s at step %d\n", newID, source, step)
	demo.Print(stdout, result)
	return exitOK
}

// multiFlag collects a repeated flag (fork's --reply).
type multiFlag []string

func (m *multiFlag) String() string     { return fmt.Sprint([]string(*m)) }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }
