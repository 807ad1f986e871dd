package worker_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/parsers"
	"github.com/polyloop/polyloop/scripted"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/worker"
)

// A pool with one agent, "greeter", on a bbolt file: Submit makes a run
// durable and returns; Work drives it; the pool's Done hook reports it,
// and here stops the pool once the run finished.
func ExamplePool() {
	dir, err := os.MkdirTemp("", "pool-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store, err := kv.Open(filepath.Join(dir, "runs.db"), kv.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	// An agent builds one run from its id and input; every worker that
	// claims the run builds it again, the same way.
	greeter := func(ctx context.Context, runID string, input []byte) (engine.Definition, engine.Request, error) {
		tools, err := seams.NewRegistry()
		if err != nil {
			return engine.Definition{}, engine.Request{}, err
		}
		def := engine.Definition{Model: &scripted.Model{Turns: scripted.Replies("FINAL: hello, " + string(input))}, Parser: parsers.ToolCalls{}}
		req := engine.Request{Tools: tools, Executor: tools.Executor(), ModelReplayPolicy: events.ReplaySafe,
			Budget:  engine.Budget{MaxSteps: 3, MaxActions: 3, MaxConsecutiveParseFailures: 1, MaxPromptChars: 10_000},
			Context: engine.Context{GoalLevel: []seams.Message{seams.Text(seams.RoleUser, "Greet "+string(input)+".")}}}
		return def, req, nil
	}

	ctx, stop := context.WithCancel(context.Background())
	pool, err := worker.New(store, map[string]worker.Agent{"greeter": greeter}, worker.Options{
		Done: func(runID string, res events.RunResult, err error) {
			if err != nil { // stopped unfinished (engine.ErrInterrupted), or failed
				fmt.Println(runID, err)
				return
			}
			fmt.Printf("%s: %s, %q\n", runID, res.StopReason, *res.FinalAnswer)
			stop() // one run is all this example waits for
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	started, err := pool.Submit(ctx, "greeter", "greet-ada", []byte("Ada"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("submitted:", started.Kind)
	if err := pool.Work(ctx); err != nil { // returns once ctx ends and its runs stopped
		log.Fatal(err)
	}
	// Output:
	// submitted: run_started
	// greet-ada: agent_finished, "hello, Ada"
}
