// Command codeagent is a tool-less code agent in PolyLoop, in the style of
// a ReAct agent over a sandbox: the model writes one fenced code block per
// step, the sandbox runs it with an interpreter in the run's working
// directory, and the run completes when the program prints the done marker.
//
// Offline by default (a scripted model); with -url it talks to any
// OpenAI-compatible endpoint. -crash-after N stops the process after N
// durable writes, as a crash would, and -resume continues the run:
//
//	go run ./examples/codeagent -run demo -crash-after 3
//	go run ./examples/codeagent -run demo -resume
//
// -fork-from RUN -at STEP starts the run -run as a fork of the stored run
// RUN at step STEP (engine.Fork): its log begins with RUN's steps below
// STEP, and it goes on under this invocation's flags — another -url,
// -model or -interpreter. Its working directory starts as a copy of RUN's
// as RUN left it (files are not in the log: the copy is their state now,
// not at step STEP):
//
//	go run ./examples/codeagent -run demo-2 -fork-from demo -at 2
//
// Exit status: 0 the agent reached an answer, 1 an error (a fork refused:
// a step beyond RUN's end, -run taken, RUN not found) or a run that
// stopped before an answer, 3 a crash on purpose, 130 interrupted
// (Ctrl-C, at a step boundary) or cancelled.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/polyloop/polyloop/crashstore"
	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/openai"
	"github.com/polyloop/polyloop/parsers"
	"github.com/polyloop/polyloop/progress"
	"github.com/polyloop/polyloop/scripted"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/stores"
)

const goal = `Create a file notes.txt holding the line "durable agents", count its words, and
when the count is right print TASK_COMPLETE.`

// script is the offline model: what a model would write, including text
// after the code block that the parser drops from the history.
var script = []string{
	"I'll create the file first.\n```sh\necho 'durable agents' > notes.txt\ncat notes.txt\n```\nOutput: durable agents",
	"Now count the words.\n```sh\nwc -w < notes.txt\n```",
	"Let me think about this.",
	"Two words, as expected.\n```sh\ntest \"$(wc -w < notes.txt)\" -eq 2 && echo TASK_COMPLETE\n```",
}

type config struct {
	store, runID, url, model, interpreter, workRoot string
	resume                                          bool
	crashAfter                                      int
	// forkFrom, when set, names the run that runID forks at step at.
	forkFrom string
	at       int
	// interrupt, once closed, stops the run at its next step boundary,
	// resumable (Ctrl-C).
	interrupt <-chan struct{}
}

func main() {
	var c config
	flag.StringVar(&c.store, "store", "codeagent.db", "bbolt store file or postgres:// URL")
	flag.StringVar(&c.runID, "run", "codeagent-1", "run id")
	flag.StringVar(&c.url, "url", "", "OpenAI-compatible base URL (e.g. http://localhost:11434/v1); empty: scripted model")
	flag.StringVar(&c.model, "model", "qwen2.5-coder", "model name for -url")
	flag.StringVar(&c.interpreter, "interpreter", "sh", "interpreter that runs each code block")
	flag.StringVar(&c.workRoot, "work", filepath.Join(os.TempDir(), "polyloop-codeagent"), "root of the runs' working directories")
	flag.BoolVar(&c.resume, "resume", false, "resume the run instead of starting it")
	flag.IntVar(&c.crashAfter, "crash-after", -1, "exit abruptly after this many durable writes (to try -resume)")
	flag.StringVar(&c.forkFrom, "fork-from", "", "start -run as a fork of this stored run at step -at, under these flags")
	flag.IntVar(&c.at, "at", 0, "the step -fork-from forks at: the fork copies the source's steps below it")
	flag.Parse()
	// Ctrl-C stops the run at its next step boundary, unfinished and
	// resumable (-resume continues it), as a crash would but with nothing
	// in doubt. (Cancelling the run — polyloop-admin cancel — finishes it.)
	interrupted, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	context.AfterFunc(interrupted, stop) // a second Ctrl-C kills at once
	c.interrupt = interrupted.Done()
	r, err := run(context.Background(), c)
	switch {
	case errors.Is(err, engine.ErrInterrupted):
		fmt.Fprintln(os.Stderr, "codeagent: interrupted at a step boundary; continue with -resume")
		os.Exit(130)
	case errors.Is(err, crashstore.ErrCrashed):
		fmt.Fprintln(os.Stderr, "codeagent: crashed on purpose after", c.crashAfter, "durable writes; continue with -resume")
		os.Exit(3)
	case err != nil:
		fmt.Fprintln(os.Stderr, "codeagent:", err)
		os.Exit(1)
	}
	if c.forkFrom != "" {
		fmt.Printf("run %s forked from %s at step %d\n", r.RunID, c.forkFrom, c.at)
	}
	fmt.Printf("run %s: %s after %d steps; %s\n", r.RunID, r.StopReason, len(r.Steps), r.Usage)
	for _, s := range r.Steps {
		fmt.Printf("--- step %d (%s)\n%s\n", s.StepIdx, statusOf(s), s.Observation)
	}
	os.Exit(exitCode(r.StopReason))
}

// exitCode: 0 when the agent reached an answer, 130 when cancelled, 1
// when the run stopped for another reason (a budget, a failing model or
// environment).
func exitCode(reason events.StopReason) int {
	switch reason {
	case events.StopTaskCompleted, events.StopAgentFinished:
		return 0
	case events.StopCancelled:
		fmt.Fprintln(os.Stderr, "codeagent: the run was cancelled (recorded; it will not resume)")
		return 130
	}
	fmt.Fprintf(os.Stderr, "codeagent: the run stopped with %s before an answer\n", reason)
	return 1
}

// statusOf labels a step: its action's status, a failed model call, a
// reply that did not parse, or no action.
func statusOf(s events.StepRecord) string {
	switch {
	case s.ActionStatus != nil:
		return string(*s.ActionStatus)
	case s.CallID == nil && s.RawOutput == "" && !s.ParseOK:
		return "model call failed: " + s.Observation
	case !s.ParseOK:
		return "parse failed"
	}
	return "no action"
}

func run(ctx context.Context, c config) (events.RunResult, error) {
	switch {
	case c.forkFrom != "" && c.resume:
		return events.RunResult{}, errors.New("-fork-from starts a new run and -resume continues one: give one of them")
	case c.forkFrom == "" && c.at != 0:
		return events.RunResult{}, fmt.Errorf("-at %d: a step to fork at needs -fork-from RUN", c.at)
	case c.forkFrom != "" && c.crashAfter >= 0:
		return events.RunResult{}, errors.New("-fork-from with -crash-after: the crashing store does not fork runs; fork first, then go on with -resume and -crash-after")
	}
	store, err := stores.Open(ctx, c.store, stores.Options{})
	if err != nil {
		return events.RunResult{}, err
	}
	defer store.Close()
	var model seams.ModelClient = &scripted.Model{Turns: scripted.Replies(script...)}
	if c.url != "" {
		if model, err = openai.New(openai.Options{BaseURL: c.url, Model: c.model}); err != nil {
			return events.RunResult{}, err
		}
	}
	var runStore seams.RunStore = store
	if c.crashAfter >= 0 {
		runStore = &crashstore.Store{Inner: store, After: c.crashAfter}
	}
	def, req := agent(model, runStore, c)
	if c.forkFrom != "" {
		return fork(ctx, def, req, c)
	}
	if c.resume {
		r, err := engine.Resume(ctx, def, req)
		if errors.Is(err, engine.ErrRunNotFound) {
			err = fmt.Errorf("%w: start it without -resume", err)
		}
		return r, err
	}
	r, err := engine.Run(ctx, def, req)
	if errors.Is(err, engine.ErrRunExists) {
		err = fmt.Errorf("%w: continue it with -resume, or start another with -run NAME", err)
	}
	return r, err
}

// fork starts c.runID as a fork of c.forkFrom at step c.at, its working
// directory seeded from the source's; a refusal says what to change.
func fork(ctx context.Context, def engine.Definition, req engine.Request, c config) (events.RunResult, error) {
	sb := req.Executor.(*sandbox)
	sb.SeedFrom = sb.dir(c.forkFrom) // used only when the fork's directory is made
	r, err := engine.Fork(ctx, def, req, c.forkFrom, c.at)
	switch {
	case errors.Is(err, engine.ErrForkStep):
		err = fmt.Errorf("run %q has no step %d to fork at: %w", c.forkFrom, c.at, err)
	case errors.Is(err, engine.ErrRunExists):
		err = fmt.Errorf("run %q exists in %s: a fork needs a new run id (-run NAME): %w", c.runID, stores.Describe(c.store), err)
	case errors.Is(err, engine.ErrRunNotFound):
		err = fmt.Errorf("no run %q to fork in %s: %w", c.forkFrom, stores.Describe(c.store), err)
	}
	return r, err
}

func agent(model seams.ModelClient, store seams.RunStore, c config) (engine.Definition, engine.Request) {
	def := engine.Definition{Model: model, Parser: parsers.FencedCode{}, Store: store, Interrupt: c.interrupt,
		Events: progress.New(os.Stdout)} // a line per step as it becomes durable
	req := engine.Request{
		RunID:             c.runID,
		Budget:            engine.Budget{MaxSteps: 12, MaxActions: 10, MaxConsecutiveParseFailures: 3, MaxPromptChars: 60_000},
		Executor:          &sandbox{Interpreter: c.interpreter, Timeout: 10 * time.Second, MaxChars: 4000, Done: "TASK_COMPLETE", Root: c.workRoot},
		ModelReplayPolicy: events.ReplaySafe,
		Context: engine.Context{
			RunLevel: []seams.Message{seams.Text(seams.RoleSystem,
				"You solve tasks by writing one fenced shell code block per reply. You see its output next turn.")},
			GoalLevel: []seams.Message{seams.Text(seams.RoleUser, goal)},
		},
		ObservationTemplate: "Output:\n{observation}",
	}
	return def, req
}
