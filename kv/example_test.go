package kv_test

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
)

// A store in a file: one run is driven on it, then the store lists its
// runs from the index and loads the run's events.
func ExampleOpen() {
	dir, err := os.MkdirTemp("", "polyloop-kv")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store, err := kv.Open(filepath.Join(dir, "runs.db"), kv.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	ctx := context.Background()
	def := engine.Definition{Model: &scripted.Model{Turns: scripted.Replies("FINAL: 42")}, Parser: parsers.ToolCalls{}, Store: store}
	tools, _ := seams.NewRegistry()
	if _, err := engine.Run(ctx, def, engine.Request{RunID: "answer-1", Tools: tools, ModelReplayPolicy: events.ReplaySafe}); err != nil {
		log.Fatal(err)
	}

	runs, err := store.Runs(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range runs {
		fmt.Println(r.RunID, r.Status, r.StopReason, r.Steps, "step,", r.Events, "events")
	}
	stream, err := store.Load(ctx, "answer-1")
	if err != nil {
		log.Fatal(err)
	}
	for _, env := range stream {
		fmt.Println(env.Kind)
	}
	// Output:
	// answer-1 finished agent_finished 1 step, 5 events
	// run_started
	// intent
	// model_call_result
	// step_completed
	// run_finished
}
