package stores_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/parsers"
	"github.com/polyloop/polyloop/scripted"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/stores"
)

// A store named as a command line names it: a file path opens a bbolt
// store (a postgres:// URL would open PostgreSQL), and Describe names a
// target fit to print, its password masked.
func ExampleOpen() {
	dir, err := os.MkdirTemp("", "polyloop-stores")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	target := filepath.Join(dir, "runs.db")
	store, err := stores.Open(ctx, target, stores.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	def := engine.Definition{Model: &scripted.Model{Turns: scripted.Replies("FINAL: 42")}, Parser: parsers.ToolCalls{}, Store: store}
	tools, _ := seams.NewRegistry()
	if _, err := engine.Run(ctx, def, engine.Request{RunID: "answer-1", Tools: tools, ModelReplayPolicy: events.ReplaySafe}); err != nil {
		log.Fatal(err)
	}
	runs, err := store.Runs(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(stores.IsPostgres(target), len(runs), "run:", runs[0].RunID, runs[0].StopReason)

	url := "postgres://agent:s3cret@db.internal:5432/runs?sslmode=require"
	fmt.Println(stores.IsPostgres(url), stores.Describe(url))
	// Output:
	// false 1 run: answer-1 agent_finished
	// true postgres://agent:xxxxx@db.internal:5432/runs?sslmode=require
}
