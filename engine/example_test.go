package engine_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/polyloop/polyloop/crashstore"
	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/parsers"
	"github.com/polyloop/polyloop/scripted"
	"github.com/polyloop/polyloop/seams"
)

// populationTools is a lookup tool and a submit tool that completes the run;
// ran counts the lookups executed.
func populationTools(ran *int) *seams.Registry {
	tools, err := seams.NewRegistry(
		seams.Tool{
			Spec: seams.ToolSpec{Name: "lookup", Description: "Look up a city's population.", ReplayPolicy: events.ReplaySafe,
				Parameters: map[string]any{"type": "object", "required": []string{"city"},
					"properties": map[string]any{"city": map[string]any{"type": "string"}}}},
			Handler: func(_ context.Context, args map[string]any) (string, error) {
				*ran++
				city, _ := args["city"].(string)
				return city + ": " + map[string]string{"Paris": "2.1 million", "Lyon": "0.5 million"}[city], nil
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
	return tools
}

// A tool agent: the model looks something up, then submits; the submit tool
// completes the run. Every step is durable in a bbolt file. The parser is
// the production one for tool agents (a `TOOL name {json}` line), and the
// executor is the registry's own, since the request gives no other.
func ExampleRun() {
	dir, _ := os.MkdirTemp("", "polyloop-example")
	defer os.RemoveAll(dir)
	store, err := kv.Open(filepath.Join(dir, "runs.db"), kv.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	var lookups int
	def := engine.Definition{
		Model: &scripted.Model{Turns: scripted.Replies(
			`I will look it up.
TOOL lookup {"city":"Paris"}`,
			`TOOL submit {"answer":"2.1 million"}`,
		)},
		Parser: parsers.ToolCalls{},
		Store:  store,
	}
	result, err := engine.Run(context.Background(), def, engine.Request{
		RunID:             "population-1",
		Budget:            engine.Budget{MaxSteps: 5}, // the other fields take their defaults
		Tools:             populationTools(&lookups),
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

// A run that crashes mid-way and is resumed: the store fails its fourth
// write as a dying process would (crashstore), after the first step
// completed and the second step's model call was announced. Resume reads
// the log, makes that model call again (its policy is safe) and finishes
// the run; the first step's lookup does not run again.
func ExampleResume() {
	dir, _ := os.MkdirTemp("", "polyloop-example")
	defer os.RemoveAll(dir)
	store, err := kv.Open(filepath.Join(dir, "runs.db"), kv.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	var lookups int
	def := engine.Definition{
		Model: &scripted.Model{Turns: scripted.Replies(
			`TOOL lookup {"city":"Paris"}`,
			`TOOL lookup {"city":"Lyon"}`,
			`TOOL submit {"answer":"2.6 million"}`,
		)},
		Parser: parsers.ToolCalls{},
		Store:  &crashstore.Store{Inner: store, After: 3},
	}
	req := engine.Request{
		RunID:             "population-2",
		Tools:             populationTools(&lookups),
		ModelReplayPolicy: events.ReplaySafe,
		Context: engine.Context{GoalLevel: []seams.Message{
			seams.Text(seams.RoleUser, "How many people live in Paris and Lyon together?"),
		}},
	}
	_, err = engine.Run(context.Background(), def, req)
	fmt.Println("crashed:", errors.Is(err, crashstore.ErrCrashed), "after", lookups, "lookup")

	def.Store = store // the process restarted: the same file, no crash
	result, err := engine.Resume(context.Background(), def, req)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(result.StopReason, len(result.Steps), "steps,", lookups, "lookups in all")
	// Output:
	// crashed: true after 1 lookup
	// task_completed 3 steps, 2 lookups in all
}

// The one call of a program that may be restarted: the first RunOrResume
// starts the run, a later one (here the second; after a crash, one that
// continues it) returns the finished run's recorded result, writing
// nothing and calling no model.
func ExampleRunOrResume() {
	dir, _ := os.MkdirTemp("", "polyloop-example")
	defer os.RemoveAll(dir)
	store, err := kv.Open(filepath.Join(dir, "runs.db"), kv.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	model := &scripted.Model{Turns: scripted.Replies(`FINAL: 42`)}
	def := engine.Definition{Model: model, Parser: parsers.ToolCalls{}, Store: store}
	req := engine.Request{
		RunID:             "answer-1",
		Tools:             populationTools(new(int)),
		ModelReplayPolicy: events.ReplaySafe,
		Context:           engine.Context{GoalLevel: []seams.Message{seams.Text(seams.RoleUser, "What is 6 × 7?")}},
	}
	for range 2 {
		result, err := engine.RunOrResume(context.Background(), def, req)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(result.StopReason, *result.FinalAnswer, "after", len(model.Calls()), "model call")
	}
	// Output:
	// agent_finished 42 after 1 model call
	// agent_finished 42 after 1 model call
}
