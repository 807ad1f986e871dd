package pgstore_test

import (
	"context"
	"fmt"
	"log"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/parsers"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/scripted"
	"github.com/polyloop/polyloop/seams"
)

// A store in a PostgreSQL database, its tables in a schema of their own
// (created, with the tables, by Open). A service passes its own DSN —
// "postgres://user:password@host/db" — where this example takes the
// tests' throwaway server's. A run is driven on it and listed.
func ExampleOpen() {
	dsn, err := pgtest.Lookup() // the tests' server; a service has its own DSN
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	store, err := pgstore.Open(ctx, dsn, pgstore.Options{Schema: "example_open"})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	def := engine.Definition{Model: &scripted.Model{Turns: scripted.Replies("FINAL: 42")}, Parser: parsers.ToolCalls{}, Store: store}
	tools, _ := seams.NewRegistry()
	// RunOrResume: on a server kept between test runs (POLYLOOP_PG_DSN)
	// the run may be there already, finished; its result is the same.
	result, err := engine.RunOrResume(ctx, def, engine.Request{RunID: "answer-1", Tools: tools, ModelReplayPolicy: events.ReplaySafe})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(result.StopReason, *result.FinalAnswer)
	runs, err := store.Runs(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range runs {
		fmt.Println(r.RunID, r.Status, r.Steps, "step,", r.Events, "events")
	}
	fmt.Println(store.Parameters()["kind"])
	// Output:
	// agent_finished 42
	// answer-1 finished 1 step, 5 events
	// postgres
}
