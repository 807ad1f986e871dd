// Command refund is a support agent that may pay money back, and a person
// says yes first: a refund over 100 (an approval policy, -approve-over)
// waits for a decision. The run stops with the refund's intent durable —
// the program prints the pending call and the polyloop-admin commands
// that decide it, and exits — a person approves (the arguments edited or
// not) or rejects it, and running the program again goes on: an approved
// refund is made once, a rejected one never, the model told the
// reviewer's note.
//
//	go run ./examples/refund                 # the refund of 250 awaits approval
//	go run ./cmd/polyloop-admin approve refund.db refund-1 CALL
//	go run ./examples/refund                 # refunds once, answers
//
// The payment provider is a file, refund-ledger.jsonl, one line per refund
// made, with its call id (a real provider would take the call id as its
// idempotency key; this one does not, so a second refund would show). A
// refund whose outcome a crash left in doubt is never made again: the run
// waits for an operator's finding (engine.Request.AwaitResolution) — look
// in the ledger, then polyloop-admin resolve --executed or --not-executed.
// -crash-after N stops the process after N durable writes, as a crash
// would (exit 3); -provider-delay makes the provider slow to confirm, long
// enough to kill -9 the process while a refund is being made.
//
// -fork-from RUN -at STEP starts the run -run as a fork of the stored run
// RUN at step STEP (engine.Fork): its log begins with RUN's steps below
// STEP, and it goes on under this invocation's flags — another
// -approve-over, -url or -model; its RunStarted records how they differ.
// Run the program again with the fork's -run (and no -fork-from) to go on
// with it:
//
//	go run ./examples/refund -run refund-2 -fork-from refund-1 -at 1 -approve-over 300
//
// Offline by default (a scripted clerk that answers from what it was
// told); with -url it talks to any OpenAI-compatible endpoint. Exit
// status: 0 when the run finished or waits for a person (the output says
// which and how to decide), 1 an error (a fork refused: a step beyond
// RUN's end, -run taken, RUN not found), 3 a crash on purpose, 130
// interrupted (Ctrl-C, at a step boundary).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/polyloop/polyloop/crashstore"
	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/openai"
	"github.com/polyloop/polyloop/parsers"
	"github.com/polyloop/polyloop/progress"
	"github.com/polyloop/polyloop/report"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/stores"
)

type config struct {
	store, ledger, runID, url, model string
	approveOver                      float64
	crashAfter                       int
	providerDelay                    time.Duration
	// forkFrom, when set, names the run that runID forks at step at.
	forkFrom string
	at       int
	// interrupt, once closed, stops the run at its next step boundary,
	// resumable (Ctrl-C).
	interrupt <-chan struct{}
}

func main() {
	var c config
	flag.StringVar(&c.store, "store", "refund.db", "bbolt store file or postgres:// URL")
	flag.StringVar(&c.ledger, "ledger", "refund-ledger.jsonl", "the payment provider's ledger: one line per refund made")
	flag.StringVar(&c.runID, "run", "refund-1", "run id")
	flag.Float64Var(&c.approveOver, "approve-over", 100, "refunds over this amount wait for a person's approval (fixed when the run starts)")
	flag.StringVar(&c.url, "url", "", "OpenAI-compatible base URL; empty: the scripted clerk")
	flag.StringVar(&c.model, "model", "qwen2.5", "model name for -url")
	flag.IntVar(&c.crashAfter, "crash-after", -1, "exit abruptly after this many durable writes (then run again)")
	flag.DurationVar(&c.providerDelay, "provider-delay", 0, "how long the payment provider takes to confirm a refund it made")
	flag.StringVar(&c.forkFrom, "fork-from", "", "start -run as a fork of this stored run at step -at, under these flags")
	flag.IntVar(&c.at, "at", 0, "the step -fork-from forks at: the fork copies the source's steps below it")
	flag.Parse()
	interrupted, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	context.AfterFunc(interrupted, stop) // a second Ctrl-C kills at once
	c.interrupt = interrupted.Done()
	err := handle(context.Background(), c, os.Stdout)
	switch {
	case errors.Is(err, engine.ErrInterrupted):
		fmt.Fprintln(os.Stderr, "refund: interrupted at a step boundary; run again to go on")
		os.Exit(130)
	case errors.Is(err, crashstore.ErrCrashed):
		fmt.Fprintln(os.Stderr, "refund: crashed on purpose after", c.crashAfter, "durable writes; run again to go on")
		os.Exit(3)
	case err != nil:
		fmt.Fprintln(os.Stderr, "refund:", err)
		os.Exit(1)
	}
}

// handle runs the ticket's run, or goes on with it, and says how it ended
// or what it waits for.
func handle(ctx context.Context, c config, out io.Writer) error {
	switch {
	case c.forkFrom == "" && c.at != 0:
		return fmt.Errorf("-at %d: a step to fork at needs -fork-from RUN", c.at)
	case c.forkFrom != "" && c.crashAfter >= 0:
		return errors.New("-fork-from with -crash-after: the crashing store does not fork runs; fork first, then go on with -run and -crash-after")
	}
	store, err := stores.Open(ctx, c.store, stores.Options{})
	if err != nil {
		return err
	}
	defer store.Close()
	reg, err := tools(&provider{path: c.ledger, delay: c.providerDelay})
	if err != nil {
		return err
	}
	var model seams.ModelClient = clerk{}
	if c.url != "" {
		if model, err = openai.New(openai.Options{BaseURL: c.url, Model: c.model}); err != nil {
			return err
		}
	}
	var runStore seams.RunStore = store
	if c.crashAfter >= 0 {
		runStore = &crashstore.Store{Inner: store, After: c.crashAfter}
	}
	def := engine.Definition{Model: model, Parser: parsers.ToolCalls{}, Store: runStore, Interrupt: c.interrupt,
		Events: progress.New(out)} // a line per step as it becomes durable
	req := engine.Request{
		RunID:             c.runID,
		Budget:            engine.Budget{MaxSteps: 8, MaxActions: 6, MaxConsecutiveParseFailures: 3, MaxPromptChars: 40_000},
		Tools:             reg,
		Executor:          reg.Executor(),
		ModelReplayPolicy: events.ReplaySafe,
		Approval:          refundsOver{limit: c.approveOver},
		// A refund left in doubt by a crash is never made again: the run
		// waits for an operator who looks at the ledger.
		AwaitResolution: true,
		Context: engine.Context{
			RunLevel: []seams.Message{seams.Text(seams.RoleSystem,
				`You are a support clerk. Look the order up, then refund what the customer is owed. Answer with one JSON object per reply: {"tool": "<name>", "arguments": {...}}, or {"final": "<your answer to the customer>"}.`)},
			GoalLevel: []seams.Message{seams.Text(seams.RoleUser, ticket)},
		},
		ObservationTemplate: "Tool result: {observation}",
	}
	var res events.RunResult
	if c.forkFrom != "" {
		res, err = fork(ctx, def, req, c)
		if err == nil || errors.As(err, new(*engine.AwaitingError)) || errors.Is(err, engine.ErrInterrupted) {
			fmt.Fprintf(out, "%s forked from %s at step %d\n", c.runID, c.forkFrom, c.at)
		}
	} else {
		res, err = engine.Resume(ctx, def, req) // go on with the run if it exists...
		if errors.Is(err, engine.ErrRunNotFound) {
			res, err = engine.Run(ctx, def, req) // ...or start it
		}
	}
	var awaiting *engine.AwaitingError
	if errors.As(err, &awaiting) {
		waits(out, stores.Describe(c.store), c.ledger, awaiting)
		return nil
	}
	if err != nil {
		return err
	}
	answer := "(no answer)"
	if res.FinalAnswer != nil {
		answer = *res.FinalAnswer
	}
	fmt.Fprintf(out, "%s: %s after %d steps: %s\n", c.runID, res.StopReason, len(res.Steps), answer)
	return nil
}

// fork starts c.runID as a fork of c.forkFrom at step c.at; a refusal
// says what to change.
func fork(ctx context.Context, def engine.Definition, req engine.Request, c config) (events.RunResult, error) {
	res, err := engine.Fork(ctx, def, req, c.forkFrom, c.at)
	switch {
	case errors.Is(err, engine.ErrForkStep):
		err = fmt.Errorf("run %q has no step %d to fork at: %w", c.forkFrom, c.at, err)
	case errors.Is(err, engine.ErrRunExists):
		err = fmt.Errorf("run %q exists in %s: a fork needs a new run id (-run NAME): %w", c.runID, stores.Describe(c.store), err)
	case errors.Is(err, engine.ErrRunNotFound):
		err = fmt.Errorf("no run %q to fork in %s: %w", c.forkFrom, stores.Describe(c.store), err)
	}
	return res, err
}

// waits says what the run waits for, and how to decide it: the pending
// call, since when, and the polyloop-admin commands (store named as
// stores.Describe names it, a password masked).
func waits(out io.Writer, store, ledger string, a *engine.AwaitingError) {
	for _, p := range a.Calls {
		switch p.Awaits {
		case events.AwaitsResolution:
			fmt.Fprintf(out, "%s waits for an operator: a crash left %s %s (step %d, call %s) in doubt since %s.\n",
				a.RunID, p.Tool, p.Arguments, p.Step, p.Call, report.Stamp(p.Since))
			fmt.Fprintf(out, "Look for call %s in the provider's ledger (%s), then say what you found:\n", p.Call, ledger)
		default:
			fmt.Fprintf(out, "%s waits for a person's approval: %s %s (step %d, call %s), since %s.\n",
				a.RunID, p.Tool, p.Arguments, p.Step, p.Call, report.Stamp(p.Since))
		}
		report.WriteDecisionCommands(out, "  ", report.DecisionCommands(store, a.RunID, p))
	}
	fmt.Fprintln(out, "Then run this program again: the run goes on.")
}
