package retention_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/parsers"
	"github.com/polyloop/polyloop/retention"
	"github.com/polyloop/polyloop/scripted"
	"github.com/polyloop/polyloop/seams"
)

// Expire deletes the finished runs whose last event is older than the
// cutoff: here the old finished run goes, while a newer finished run and an
// old unfinished one (started, never driven: it may still be resumed) stay.
func ExampleExpire() {
	dir, err := os.MkdirTemp("", "polyloop-retention")
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
	tools, _ := seams.NewRegistry()
	run := func(runID string) engine.Request {
		return engine.Request{RunID: runID, Tools: tools, ModelReplayPolicy: events.ReplaySafe}
	}
	def := engine.Definition{Model: &scripted.Model{Turns: scripted.Replies("FINAL: done")}, Parser: parsers.ToolCalls{}, Store: store}

	if _, err := engine.Run(ctx, def, run("old")); err != nil {
		log.Fatal(err)
	}
	if _, err := engine.Start(ctx, def, run("unfinished")); err != nil {
		log.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	cutoff := time.Now() // a service passes, say, time.Now().AddDate(0, 0, -30)
	time.Sleep(5 * time.Millisecond)
	if _, err := engine.Run(ctx, def, run("new")); err != nil {
		log.Fatal(err)
	}

	res, err := retention.Expire(ctx, store, cutoff)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("deleted:", res.Deleted)
	runs, _ := store.Runs(ctx)
	for _, r := range runs {
		fmt.Println("kept:", r.RunID, r.Status)
	}
	// Output:
	// deleted: [old]
	// kept: new finished
	// kept: unfinished interrupted
}
