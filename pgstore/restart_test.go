package pgstore_test

import (
	"context"
	"os"
	"testing"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// TestServerRestartUnderARunningAgent: the server restarts (every
// connection dropped) while a run waits on its model or its action; the
// run's next append fails with an error, the log stays sound, and Resume
// on the same store — its pool reconnects — finishes the run as an
// uninterrupted one would.
func TestServerRestartUnderARunningAgent(t *testing.T) {
	if os.Getenv(pgtest.DSNEnv) != "" {
		t.Skip("restarts a throwaway server; " + pgtest.DSNEnv + " names a server of yours")
	}
	srv, err := pgtest.Start(pgtest.Options{})
	if err != nil {
		pgtest.Unavailable(t, err)
	}
	defer srv.Stop()
	ctx := context.Background()
	store, err := pgstore.Open(ctx, srv.DSN, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	reg, err := seams.NewRegistry(
		seams.Tool{Spec: seams.ToolSpec{Name: "count", ReplayPolicy: events.ReplaySafe},
			Handler: func(context.Context, map[string]any) (string, error) { return "3 files", nil }},
		seams.Tool{Spec: seams.ToolSpec{Name: "submit", CompletesRun: true, ReplayPolicy: events.ReplaySafe},
			Handler: func(context.Context, map[string]any) (string, error) { return "ok", nil }})
	if err != nil {
		t.Fatal(err)
	}
	script := seamstest.Replies(`TOOL count {}`, `TOOL count {}`, `TOOL submit {}`)
	agent := func(runID string, p *seamstest.Gate, inModel bool) (engine.Definition, engine.Request) {
		var model seams.ModelClient = &seamstest.Model{Turns: script}
		var exec seams.ActionExecutor = reg.Executor()
		if p != nil && inModel {
			model = &seamstest.PausingModel{ModelClient: &seamstest.Model{Turns: script}, Gate: p}
		} else if p != nil {
			exec = &seamstest.PausingExecutor{ActionExecutor: exec, Gate: p}
		}
		return engine.Definition{Model: model, Parser: seamstest.Parser{}, Store: store},
			engine.Request{RunID: runID, Tools: reg, Executor: exec, ModelReplayPolicy: events.ReplaySafe,
				Budget: engine.Budget{MaxSteps: 6, MaxActions: 6, MaxConsecutiveParseFailures: 2, MaxPromptChars: 10_000}}
	}
	def, req := agent("ref", nil, false)
	want, err := engine.Run(ctx, def, req)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		inModel bool
	}{{"waiting on the model", true}, {"waiting on an action", false}} {
		t.Run(c.name, func(t *testing.T) {
			runID := "restart-" + c.name
			p := seamstest.NewGate(2)
			def, req := agent(runID, p, c.inModel)
			type ended struct {
				r   events.RunResult
				err error
			}
			done := make(chan ended, 1)
			go func() { r, err := engine.Run(ctx, def, req); done <- ended{r, err} }()
			select {
			case <-p.Entered:
			case e := <-done:
				t.Fatalf("run ended before the pause: %v", e.err)
			}
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
			close(p.Release)
			// No connection is held while a run waits: its next append
			// takes a fresh one, and the run finishes as an uninterrupted
			// one would.
			e := <-done
			if e.err != nil {
				t.Fatalf("the run did not go on after the restart: %v", e.err)
			}
			if e.r.StopReason != want.StopReason || len(e.r.Steps) != len(want.Steps) {
				t.Fatalf("the run ended %s after %d steps, want %s after %d", e.r.StopReason, len(e.r.Steps), want.StopReason, len(want.Steps))
			}
			stream, err := store.Load(ctx, runID)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := recovery.Classify(runID, stream); err != nil {
				t.Fatalf("the restart left a corrupt log: %v", err)
			}
		})
	}
}
