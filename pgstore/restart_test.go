package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
// run holds no connection meanwhile (its lease is a row, not a session),
// so its next append goes through a fresh one and the run finishes as an
// uninterrupted one would, its log sound.
func TestServerRestartUnderARunningAgent(t *testing.T) {
	srv := restartable(t)
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

// TestServerRestartUnder64RunningAgents: the server restarts while 64
// agents run, each waiting on its model, appending or executing at that
// moment. Every run either finishes as an uninterrupted run does or
// stops with an error naming the run, and every log is sound; Resume then
// finishes each stopped run as an uninterrupted one would (one whose
// start did not commit is run again: it has nothing to resume).
func TestServerRestartUnder64RunningAgents(t *testing.T) {
	srv := restartable(t)
	ctx := context.Background()
	store, err := pgstore.Open(ctx, srv.DSN, pgstore.Options{MaxConns: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	const runs, steps = 64, 12
	replies := make([]string, 0, steps+1)
	for range steps {
		replies = append(replies, `TOOL count {}`)
	}
	replies = append(replies, "FINAL: done")
	var executed atomic.Int32
	reg, err := seams.NewRegistry(seams.Tool{Spec: seams.ToolSpec{Name: "count", ReplayPolicy: events.ReplaySafe},
		Handler: func(context.Context, map[string]any) (string, error) { executed.Add(1); return "3 files", nil }})
	if err != nil {
		t.Fatal(err)
	}
	agent := func(runID string) (engine.Definition, engine.Request) {
		model := slowModel{ModelClient: &seamstest.Model{Turns: seamstest.Replies(replies...)}, delay: 5 * time.Millisecond}
		return engine.Definition{Model: model, Parser: seamstest.Parser{}, Store: store},
			engine.Request{RunID: runID, Tools: reg, Executor: reg.Executor(), ModelReplayPolicy: events.ReplaySafe,
				Budget: engine.Budget{MaxSteps: steps + 2, MaxActions: steps + 2, MaxConsecutiveParseFailures: 2, MaxPromptChars: 100_000}}
	}
	run := func(runID string, resume bool) (events.RunResult, error) {
		def, req := agent(runID)
		if resume {
			return engine.Resume(ctx, def, req)
		}
		return engine.Run(ctx, def, req)
	}
	want, err := run("ref", false)
	if err != nil {
		t.Fatal(err)
	}
	errs := make([]error, runs)
	var wg sync.WaitGroup
	for i := range runs {
		wg.Go(func() {
			got, err := run(fmt.Sprintf("a%02d", i), false)
			if err == nil && (got.StopReason != want.StopReason || len(got.Steps) != len(want.Steps)) {
				err = fmt.Errorf("ended %s after %d steps, want %s after %d", got.StopReason, len(got.Steps), want.StopReason, len(want.Steps))
				t.Error(err)
			}
			errs[i] = err
		})
	}
	// The restart comes a third of the way through, placed by progress,
	// not the clock.
	for executed.Load() < int32(steps+runs*steps/3) {
		time.Sleep(time.Millisecond)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	stopped := 0
	for i, err := range errs {
		runID := fmt.Sprintf("a%02d", i)
		stream, lerr := store.Load(ctx, runID)
		if lerr != nil {
			t.Fatalf("%s: %v", runID, lerr)
		}
		if _, cerr := recovery.Classify(runID, stream); cerr != nil {
			t.Fatalf("%s: the restart left a corrupt log: %v", runID, cerr)
		}
		if err == nil {
			continue
		}
		stopped++
		if !strings.Contains(err.Error(), runID) || errors.Is(err, engine.ErrRunBusy) {
			t.Errorf("%s stopped with an error that does not name it, or says busy: %v", runID, err)
		}
		if stopped == 1 {
			t.Logf("%s stopped with: %v", runID, err)
		}
		got, err := run(runID, len(stream) > 0) // a run with nothing written is run again
		if err != nil {
			t.Fatalf("%s: resume after the restart: %v", runID, err)
		}
		if got.StopReason != want.StopReason || len(got.Steps) != len(want.Steps) {
			t.Fatalf("%s resumed to %s after %d steps, want %s after %d", runID, got.StopReason, len(got.Steps), want.StopReason, len(want.Steps))
		}
	}
	t.Logf("%d of %d runs went on through the restart, %d stopped with an error and were resumed", runs-stopped, runs, stopped)
}

// slowModel answers after a delay, as a real model does.
type slowModel struct {
	seams.ModelClient
	delay time.Duration
}

func (m slowModel) Call(ctx context.Context, c seams.ModelCall) (events.ModelReply, error) {
	select {
	case <-time.After(m.delay):
	case <-ctx.Done():
		return events.ModelReply{}, ctx.Err()
	}
	return m.ModelClient.Call(ctx, c)
}

// restartable starts a throwaway server of the test's own, which it may
// restart, stopped when t ends; it skips when POLYLOOP_PG_DSN names a
// server of the user's.
func restartable(t *testing.T) *pgtest.Server {
	if os.Getenv(pgtest.DSNEnv) != "" {
		t.Skip("restarts a throwaway server; " + pgtest.DSNEnv + " names a server of yours")
	}
	srv, err := pgtest.Start(pgtest.Options{})
	if err != nil {
		pgtest.Unavailable(t, err)
	}
	t.Cleanup(func() { srv.Stop() })
	return srv
}
