package engine_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// A tool agent: the model looks something up, then submits; the submit tool
// completes the run. Every step is durable in a bbolt file.
func ExampleRun() {
	dir, _ := os.MkdirTemp("", "polyloop-example")
	defer os.RemoveAll(dir)
	store, err := kv.Open(filepath.Join(dir, "runs.db"), kv.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	tools, err := seams.NewRegistry(
		seams.Tool{
			Spec: seams.ToolSpec{Name: "lookup", Description: "Look up a city's population.", ReplayPolicy: events.ReplaySafe,
				Parameters: map[string]any{"type": "object", "required": []string{"city"},
					"properties": map[string]any{"city": map[string]any{"type": "string"}}}},
			Handler: func(_ context.Context, args map[string]any) (string, error) {
				return fmt.Sprintf("%s: 2.1 million", args["city"]), nil
			},
		},
		seams.Tool{
			Spec: seams.ToolSpec{Name: "submit", Description: "Submit the answer.", CompletesRun: true},
			Handler: func(_ context.Context, args map[string]any) (string, error) {
				return "submitted", nil
			},
		},
	)
	if err != nil {
		log.Fatal(err)
	}
	def := engine.Definition{
		Model: &seamstest.Model{Turns: seamstest.Replies(
			`TOOL lookup {"city":"Paris"}`,
			`TOOL submit {"answer":"2.1 million"}`,
		)},
		Parser: seamstest.Parser{},
		Store:  store,
	}
	result, err := engine.Run(context.Background(), def, engine.Request{
		RunID:             "population-1",
		Budget:            engine.Budget{MaxSteps: 5, MaxActions: 5, MaxConsecutiveParseFailures: 2, MaxPromptChars: 10_000},
		Tools:             tools,
		Executor:          tools.Executor(),
		ModelReplayPolicy: events.ReplaySafe,
		Context: engine.Context{GoalLevel: []seams.Message{
			seams.Text(seams.RoleUser, "How many people live in Paris?"),
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(result.StopReason, len(result.Steps), "steps")
	for _, s := range result.Steps {
		fmt.Printf("step %d: %s -> %s\n", s.StepIdx, *s.ToolName, s.Observation)
	}
	// Output:
	// task_completed 2 steps
	// step 0: lookup -> Paris: 2.1 million
	// step 1: submit -> submitted
}
