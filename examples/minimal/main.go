// Command minimal is the smallest durable agent: a tool registry, a model,
// a parser, a store, one run. Kill it at any point, or press Ctrl-C, and
// run it again: it resumes the run where the log stops. The README shows
// this file whole.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/openai"
	"github.com/polyloop/polyloop/parsers"
	"github.com/polyloop/polyloop/progress"
	"github.com/polyloop/polyloop/scripted"
	"github.com/polyloop/polyloop/seams"
)

func main() {
	if len(os.Args) > 1 { // it takes no arguments: say so rather than run as if understood
		fmt.Fprintln(os.Stderr, "usage: minimal (no arguments; OPENAI_BASE_URL and OPENAI_MODEL pick a real model)")
		os.Exit(2)
	}
	// Ctrl-C stops the run at its next step boundary, unfinished: run this
	// again to resume it. (Cancelling ctx would finish it as cancelled.) A
	// second Ctrl-C kills the program at once.
	interrupted, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	context.AfterFunc(interrupted, stop)
	ctx := context.Background()
	store, err := kv.Open("minimal.db", kv.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	tools, err := seams.NewRegistry(seams.Tool{
		Spec: seams.ToolSpec{Name: "add", Description: "adds two numbers", ReplayPolicy: events.ReplaySafe,
			Parameters: map[string]any{"type": "object", "required": []string{"a", "b"}, "properties": map[string]any{
				"a": map[string]any{"type": "number"}, "b": map[string]any{"type": "number"}}}},
		Handler: func(ctx context.Context, args map[string]any) (string, error) {
			return fmt.Sprint(args["a"].(float64) + args["b"].(float64)), nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	var model seams.ModelClient = &scripted.Model{Turns: scripted.Replies( // offline: a scripted model
		`TOOL add {"a": 2, "b": 40}`, `FINAL: 2 + 40 = 42`)}
	if url := os.Getenv("OPENAI_BASE_URL"); url != "" { // or any OpenAI-compatible endpoint
		if model, err = openai.New(openai.Options{BaseURL: url, Model: os.Getenv("OPENAI_MODEL")}); err != nil {
			log.Fatal(err)
		}
	}
	// The Definition is what every run of this agent shares — here with a
	// line printed per step as it becomes durable; the Request is this
	// run's (its budget's zero fields take engine's defaults).
	def := engine.Definition{Model: model, Parser: parsers.ToolCalls{}, Store: store, Interrupt: interrupted.Done(),
		Events: progress.New(os.Stdout)}
	req := engine.Request{RunID: "minimal-1", Tools: tools,
		ModelReplayPolicy: events.ReplaySafe, // a model call may be repeated after a crash
		Context:           engine.Context{GoalLevel: []seams.Message{seams.Text(seams.RoleUser, "What is 2 + 40? Use the add tool.")}}}
	result, err := engine.RunOrResume(ctx, def, req) // continue the run if it exists, or start it
	if errors.Is(err, engine.ErrInterrupted) {
		fmt.Println("interrupted at a step boundary; run again to resume")
		return
	}
	if err != nil {
		log.Fatal(err) // infrastructure only; a crash here leaves the run resumable
	}
	answer := "(no answer)"
	if result.FinalAnswer != nil {
		answer = *result.FinalAnswer
	}
	fmt.Printf("%s after %d steps: %s\n%s\n", result.StopReason, len(result.Steps), answer, result.Usage)
}
