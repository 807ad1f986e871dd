// Command polyloop-demo runs a small tool agent to completion on a bbolt
// store file in the working directory, offline: the model is scripted, the
// tools are real (they list, read and count words in files of a sample
// folder the demo writes). It prints the result and where the store is, so
// polyloop-inspect can show what happened.
//
//	polyloop-demo [-store polyloop-demo.db | -store postgres://…] [-run RUN_ID]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/parsers"
	"github.com/polyloop/polyloop/scripted"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/stores"
)

func main() {
	storePath := flag.String("store", "polyloop-demo.db", "bbolt store file or PostgreSQL connection string (postgres:// URL or key=value)")
	runID := flag.String("run", "", "run id (default: demo-<time>)")
	flag.Parse()
	if *runID == "" {
		*runID = "demo-" + time.Now().UTC().Format("20060102T150405.000")
	}
	if err := run(*storePath, *runID); err != nil {
		fmt.Fprintln(os.Stderr, "polyloop-demo:", err)
		os.Exit(1)
	}
}

func run(storePath, runID string) error {
	folder, err := os.MkdirTemp("", "polyloop-demo-files")
	if err != nil {
		return err
	}
	defer os.RemoveAll(folder)
	samples := map[string]string{
		"notes.txt":  "PolyLoop keeps every step of an agent run in an event log.\nA crash loses nothing.\n",
		"todo.txt":   "write tests\nmeasure fsync\n",
		"readme.txt": "sample folder for the demo\n",
	}
	for name, text := range samples {
		if err := os.WriteFile(filepath.Join(folder, name), []byte(text), 0o600); err != nil {
			return err
		}
	}
	tools, err := demoTools(folder)
	if err != nil {
		return err
	}
	store, err := stores.Open(context.Background(), storePath, stores.Options{})
	if err != nil {
		return err
	}
	defer store.Close()

	def := engine.Definition{
		Model: &scripted.Model{Turns: scripted.Replies(
			`TOOL list_files {}`,
			`TOOL read_file {"name":"notes.txt"}`,
			`I think I should count the words.`, // not a decision: the parser says so
			`TOOL count_words {"name":"notes.txt"}`,
			`TOOL submit {"answer":"notes.txt has 16 words"}`,
		)},
		Parser: parsers.ToolCalls{},
		Store:  store,
	}
	req := engine.Request{
		RunID:             runID,
		Budget:            engine.Budget{MaxSteps: 8, MaxActions: 6, MaxConsecutiveParseFailures: 2, MaxPromptChars: 20_000},
		Tools:             tools,
		Executor:          tools.Executor(),
		ModelReplayPolicy: events.ReplaySafe,
		Context: engine.Context{
			RunLevel:  []seams.Message{seams.Text(seams.RoleSystem, "You answer questions about files using tools.")},
			GoalLevel: []seams.Message{seams.Text(seams.RoleUser, "How many words are in notes.txt?")},
		},
		ObservationTemplate: "Observation: {observation}",
	}
	result, err := engine.Run(context.Background(), def, req)
	if err != nil {
		return err
	}
	fmt.Printf("run %s stopped: %s after %d steps\n", result.RunID, result.StopReason, len(result.Steps))
	fmt.Printf("usage: %s\n", result.Usage)
	for _, s := range result.Steps {
		tool := "-"
		if s.ToolName != nil {
			tool = *s.ToolName
		}
		fmt.Printf("  step %d  tool=%-11s parse_ok=%-5v %q\n", s.StepIdx, tool, s.ParseOK, firstLine(s.Observation))
	}
	fmt.Printf("store: %s\n", stores.Describe(storePath))
	return nil
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

func demoTools(folder string) (*seams.Registry, error) {
	nameArg := map[string]any{"type": "object", "required": []string{"name"}, "additionalProperties": false,
		"properties": map[string]any{"name": map[string]any{"type": "string", "pattern": "^[a-z]+\\.txt$"}}}
	read := func(args map[string]any) (string, error) {
		b, err := os.ReadFile(filepath.Join(folder, args["name"].(string)))
		return string(b), err
	}
	return seams.NewRegistry(
		seams.Tool{
			Spec: seams.ToolSpec{Name: "list_files", Description: "List the files of the folder.", ReplayPolicy: events.ReplaySafe,
				Parameters: map[string]any{"type": "object", "additionalProperties": false}},
			Handler: func(context.Context, map[string]any) (string, error) {
				entries, err := os.ReadDir(folder)
				if err != nil {
					return "", seams.EnvFailure(err)
				}
				var names []string
				for _, e := range entries {
					names = append(names, e.Name())
				}
				sort.Strings(names)
				return strings.Join(names, "\n"), nil
			},
		},
		seams.Tool{
			Spec:    seams.ToolSpec{Name: "read_file", Description: "Read a file of the folder.", ReplayPolicy: events.ReplaySafe, Parameters: nameArg},
			Handler: func(_ context.Context, args map[string]any) (string, error) { return read(args) },
		},
		seams.Tool{
			Spec: seams.ToolSpec{Name: "count_words", Description: "Count the words of a file.", ReplayPolicy: events.ReplaySafe, Parameters: nameArg},
			Handler: func(_ context.Context, args map[string]any) (string, error) {
				text, err := read(args)
				if err != nil {
					return "", err
				}
				return fmt.Sprint(len(strings.Fields(text))), nil
			},
		},
		seams.Tool{
			Spec: seams.ToolSpec{Name: "submit", Description: "Submit the final answer.", CompletesRun: true,
				Parameters: map[string]any{"type": "object", "required": []string{"answer"},
					"properties": map[string]any{"answer": map[string]any{"type": "string"}}}},
			Handler: func(_ context.Context, args map[string]any) (string, error) {
				return "submitted: " + args["answer"].(string), nil
			},
		},
	)
}
