// Command fleet is a worker pool on a shared PostgreSQL database: submit
// runs from one command, start workers in others — in more terminals, or
// on more machines — and every run is driven by exactly one of them. Kill a
// worker (even with kill -9): once its leases run out, the others take its
// runs over where their durable logs stop. Stop a worker with Ctrl-C or
// SIGTERM: its runs stop at their next step boundary, unfinished, and the
// others take them at once — stopping a worker never cancels a run.
//
//	go run ./examples/fleet -db postgres://user:password@host/db submit -n 20
//	go run ./examples/fleet -db postgres://user:password@host/db work
//	go run ./examples/fleet -db postgres://user:password@host/db cancel refund-0007
//	polyloop-inspect runs postgres://user:password@host/db
//
// On a bbolt file one process holds the store, so there the pool runs in
// one process: `work -submit 20` submits and works, and a worker started
// again picks up every run a killed one left unfinished.
//
// The agent, "refunds", is scripted (offline): for each unit of its input it
// looks an order up (a tool declared safe to replay) and refunds it (one
// declared never: after a crash in doubt, its run ends
// resume_state_unknown rather than refund twice), then answers. Exit
// status: 0 done, 1 an error, 2 bad usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/parsers"
	"github.com/polyloop/polyloop/progress"
	"github.com/polyloop/polyloop/scripted"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/stores"
	"github.com/polyloop/polyloop/worker"
)

func main() {
	o := flags(flag.CommandLine)
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: fleet -db STORE submit [-n N] | work [-submit N] | cancel RUN... | resume RUN...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if o.db == "" {
		o.db = os.Getenv("DATABASE_URL")
	}
	if o.db == "" || flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	// The first Ctrl-C or SIGTERM stops the worker gracefully; a second
	// one is a crash (the default action comes back).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop)
	os.Exit(command(ctx, os.Stdout, os.Stderr, o, flag.Args()))
}

// options are the flags before the command.
type options struct {
	db    string
	delay time.Duration
}

// flags defines the flags. $DATABASE_URL is read after parsing, not made
// -db's default: -h prints defaults, and it holds a password.
func flags(fs *flag.FlagSet) *options {
	o := &options{}
	fs.StringVar(&o.db, "db", "", "PostgreSQL URL or key=value string, or a bbolt file (default $DATABASE_URL)")
	fs.DurationVar(&o.delay, "step-delay", 200*time.Millisecond, "how long each tool call takes")
	return o
}

// command runs one command and returns the exit status.
func command(ctx context.Context, stdout, stderr io.Writer, o *options, args []string) int {
	fail := func(err error) int {
		fmt.Fprintln(stderr, "fleet:", err)
		return 1
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	n := fs.Int("n", 10, "submit: how many runs")
	first := fs.Int("first", 0, "submit: the number of the first run (run ids are refund-NNNN)")
	submitToo := fs.Int("submit", 0, "work: submit this many runs first (a bbolt file, held by one process)")
	concurrency := fs.Int("concurrency", worker.DefaultConcurrency, "work: runs driven at once")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	store, err := stores.Open(ctx, o.db, stores.Options{})
	if err != nil {
		return fail(err)
	}
	defer store.Close()
	pool, err := worker.New(store, map[string]worker.Agent{"refunds": refunds(o.delay, progress.New(stdout))}, worker.Options{
		Concurrency: *concurrency,
		Done: func(runID string, res events.RunResult, err error) {
			switch {
			case err == nil:
				fmt.Fprintf(stdout, "%s: %s after %d steps\n", runID, res.StopReason, len(res.Steps))
			case errors.Is(err, engine.ErrInterrupted):
				fmt.Fprintf(stdout, "%s: stopped at a step boundary; given back to the pool\n", runID)
			case errors.Is(err, engine.ErrRunBusy):
			default:
				fmt.Fprintf(stderr, "%s: %v\n", runID, err)
			}
		},
	})
	if err != nil {
		return fail(err)
	}
	switch args[0] {
	case "submit":
		return submit(ctx, stdout, stderr, pool, *first, *n)
	case "work":
		if code := submit(ctx, stdout, stderr, pool, *first, *submitToo); code != 0 {
			return code
		}
		fmt.Fprintln(stdout, "working; Ctrl-C or SIGTERM stops at the next step boundary")
		if err := pool.Work(ctx); err != nil {
			return fail(err)
		}
		fmt.Fprintln(stdout, "stopped; the runs in progress were given back, none cancelled")
		return 0
	case "cancel", "resume":
		code := 0
		for _, runID := range fs.Args() {
			if args[0] == "resume" {
				err = pool.Resume(ctx, runID)
			} else {
				var c engine.Cancellation
				if c, err = pool.Cancel(ctx, runID, "fleet example"); err == nil && c.Holder != "" {
					fmt.Fprintf(stdout, "%s: cancel requested; %s drives it and ends it before its next side effect\n", runID, c.Holder)
					continue
				}
			}
			if err != nil {
				fmt.Fprintln(stderr, "fleet:", err)
				code = 1
				continue
			}
			if args[0] == "resume" {
				fmt.Fprintf(stdout, "%s: handed to the workers\n", runID)
			} else {
				fmt.Fprintf(stdout, "%s: cancelled (nobody drove it)\n", runID)
			}
		}
		return code
	}
	fmt.Fprintf(stderr, "fleet: unknown command %q (submit, work, cancel, resume)\n", args[0])
	return 2
}

// submit submits n runs numbered from first.
func submit(ctx context.Context, stdout, stderr io.Writer, pool *worker.Pool, first, n int) int {
	for i := first; i < first+n; i++ {
		runID := fmt.Sprintf("refund-%04d", i)
		if _, err := pool.Submit(ctx, "refunds", runID, []byte(strconv.Itoa(1+i%3))); err != nil {
			fmt.Fprintln(stderr, "fleet:", err)
			return 1
		}
		fmt.Fprintln(stdout, "submitted", runID)
	}
	return 0
}

// refunds is the example's agent: input is how many orders to refund.
// steps prints each step of every run it drives as the step becomes
// durable.
func refunds(delay time.Duration, steps *progress.Printer) worker.Agent {
	wait := func(ctx context.Context) error {
		select {
		case <-time.After(delay):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return func(ctx context.Context, runID string, input []byte) (engine.Definition, engine.Request, error) {
		orders, err := strconv.Atoi(string(input))
		if err != nil || orders < 1 || orders > 100 {
			return engine.Definition{}, engine.Request{}, fmt.Errorf("input %q is not a number of orders from 1 to 100", input)
		}
		order := map[string]any{"type": "object", "required": []string{"order"},
			"properties": map[string]any{"order": map[string]any{"type": "integer"}}}
		tools, err := seams.NewRegistry(
			seams.Tool{Spec: seams.ToolSpec{Name: "lookup", Description: "looks an order up", ReplayPolicy: events.ReplaySafe, Parameters: order},
				Handler: func(ctx context.Context, args map[string]any) (string, error) {
					return fmt.Sprintf("order %v: paid, 40 EUR", args["order"]), wait(ctx)
				}},
			seams.Tool{Spec: seams.ToolSpec{Name: "refund", Description: "refunds an order", ReplayPolicy: events.ReplayNever, Parameters: order},
				Handler: func(ctx context.Context, args map[string]any) (string, error) {
					return fmt.Sprintf("order %v refunded", args["order"]), wait(ctx)
				}},
		)
		if err != nil {
			return engine.Definition{}, engine.Request{}, err
		}
		var replies []string
		for o := range orders {
			replies = append(replies, fmt.Sprintf(`TOOL lookup {"order":%d}`, o), fmt.Sprintf(`TOOL refund {"order":%d}`, o))
		}
		replies = append(replies, fmt.Sprintf("FINAL: %d orders refunded", orders))
		def := engine.Definition{Model: &scripted.Model{Turns: scripted.Replies(replies...)}, Parser: parsers.ToolCalls{},
			Events: steps}
		req := engine.Request{Tools: tools, Executor: tools.Executor(), ModelReplayPolicy: events.ReplaySafe,
			Budget: engine.Budget{MaxSteps: 2*orders + 2, MaxActions: 2*orders + 2, MaxConsecutiveParseFailures: 2, MaxPromptChars: 100_000},
			Context: engine.Context{GoalLevel: []seams.Message{seams.Text(seams.RoleUser,
				fmt.Sprintf("Refund the %d orders of %s: look each up, then refund it.", orders, runID))}}}
		return def, req, nil
	}
}
