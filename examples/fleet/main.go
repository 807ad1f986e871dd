// Command fleet is one worker of a fleet sharing a PostgreSQL database.
// Start it several times — in two terminals, or on two machines — with the
// same -run: one worker drives the run, every other one reports that the run
// is busy (it executed nothing). Kill the driving worker (even with kill -9)
// and start one again: it resumes the run where the durable log stops.
//
//	go run ./examples/fleet -db postgres://user:password@host/db -run r1
//
// The model is scripted (offline): a dozen slow "work" steps, then a final
// answer. Exit status: 0 the run finished, 3 another worker drives it, 1 an
// error (the run stays resumable).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/parsers"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/scripted"
	"github.com/polyloop/polyloop/seams"
)

const exitBusy = 3

func main() {
	db, runID, delay := flags(flag.CommandLine)
	flag.Parse()
	if *db == "" {
		*db = os.Getenv("DATABASE_URL")
	}
	if *db == "" {
		fmt.Fprintln(os.Stderr, "fleet: -db postgres://… (or $DATABASE_URL) is required")
		os.Exit(2)
	}
	os.Exit(work(context.Background(), os.Stdout, *db, *runID, *delay))
}

// flags defines the worker's flags. $DATABASE_URL is read after parsing,
// not made -db's default: -h prints defaults, and it holds a password.
func flags(fs *flag.FlagSet) (db, runID *string, delay *time.Duration) {
	db = fs.String("db", "", "PostgreSQL URL or key=value string (default $DATABASE_URL)")
	runID = fs.String("run", "fleet-1", "run id")
	delay = fs.Duration("step-delay", 300*time.Millisecond, "how long each work step takes")
	return db, runID, delay
}

// work drives runID as one worker and returns the exit status.
func work(ctx context.Context, out io.Writer, db, runID string, delay time.Duration) int {
	store, err := pgstore.Open(ctx, db, pgstore.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		return 1
	}
	defer store.Close()
	tools, err := seams.NewRegistry(seams.Tool{
		Spec: seams.ToolSpec{Name: "work", Description: "does one unit of work", ReplayPolicy: events.ReplaySafe,
			Parameters: map[string]any{"type": "object", "required": []string{"n"},
				"properties": map[string]any{"n": map[string]any{"type": "integer"}}}},
		Handler: func(ctx context.Context, args map[string]any) (string, error) {
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return "", ctx.Err()
			}
			return fmt.Sprintf("unit %v done", args["n"]), nil
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		return 1
	}
	var replies []string
	for n := range 12 {
		replies = append(replies, fmt.Sprintf(`TOOL work {"n":%d}`, n))
	}
	def := engine.Definition{Model: &scripted.Model{Turns: scripted.Replies(append(replies, "FINAL: twelve units done")...)},
		Parser: parsers.ToolCalls{}, Store: store}
	req := engine.Request{RunID: runID, Tools: tools, Executor: tools.Executor(), ModelReplayPolicy: events.ReplaySafe,
		Budget:  engine.Budget{MaxSteps: 20, MaxActions: 20, MaxConsecutiveParseFailures: 2, MaxPromptChars: 100_000},
		Context: engine.Context{GoalLevel: []seams.Message{seams.Text(seams.RoleUser, "Do twelve units of work, then answer.")}}}

	result, err := engine.Resume(ctx, def, req) // continue the run wherever it stopped
	if errors.Is(err, engine.ErrRunNotFound) {
		result, err = engine.Run(ctx, def, req) // or start it
	}
	switch {
	case errors.Is(err, engine.ErrRunBusy):
		fmt.Fprintf(out, "run %s is driven by another worker; this one did nothing\n", runID)
		return exitBusy
	case err != nil:
		fmt.Fprintln(os.Stderr, "fleet:", err, "(the run stays resumable: start a worker again)")
		return 1
	}
	fmt.Fprintf(out, "run %s stopped: %s after %d steps; %s\n", runID, result.StopReason, len(result.Steps), result.Usage)
	return 0
}
