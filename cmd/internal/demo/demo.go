// Package demo is the agent polyloop-demo runs — a scripted model, the
// tool-call parser, tools that list, read and count words in the files of
// a sample folder — built in one place, so that polyloop-admin fork can
// rebuild the definition of a demo run and fork it.
package demo

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/parsers"
	"github.com/polyloop/polyloop/scripted"
	"github.com/polyloop/polyloop/seams"
)

// Replies are the demo model's replies, the i-th to the model call of
// step i.
var Replies = []string{
	`TOOL list_files {}`,
	`TOOL read_file {"name":"notes.txt"}`,
	`I think I should count the words.`, // not a decision: the parser says so
	`TOOL count_words {"name":"notes.txt"}`,
	`TOOL submit {"answer":"notes.txt has 16 words"}`,
}

// samples are the files of the sample folder.
var samples = map[string]string{
	"notes.txt":  "PolyLoop keeps every step of an agent run in an event log.\nA crash loses nothing.\n",
	"todo.txt":   "write tests\nmeasure fsync\n",
	"readme.txt": "sample folder for the demo\n",
}

// Folder writes the sample folder into a new temporary directory and
// returns it; the caller removes it.
func Folder() (string, error) {
	folder, err := os.MkdirTemp("", "polyloop-demo-files")
	if err != nil {
		return "", err
	}
	for name, text := range samples {
		if err := os.WriteFile(filepath.Join(folder, name), []byte(text), 0o600); err != nil {
			os.RemoveAll(folder)
			return "", err
		}
	}
	return folder, nil
}

// Agent is the demo's definition over store and its request for runID,
// with tools over folder and a model that gives the call of step i
// replies[i].
func Agent(store seams.RunStore, folder, runID string, replies []string) (engine.Definition, engine.Request, error) {
	tools, err := Tools(folder)
	if err != nil {
		return engine.Definition{}, engine.Request{}, err
	}
	def := engine.Definition{Model: &scripted.Model{Turns: scripted.Replies(replies...)}, Parser: parsers.ToolCalls{}, Store: store}
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
	return def, req, nil
}

// Tools are the demo's tools over folder.
func Tools(folder string) (*seams.Registry, error) {
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

// Print writes what a demo run did: how it stopped, its usage and a line
// per step.
func Print(w io.Writer, result events.RunResult) {
	fmt.Fprintf(w, "run %s stopped: %s after %d steps\n", result.RunID, result.StopReason, len(result.Steps))
	fmt.Fprintf(w, "usage: %s\n", result.Usage)
	for _, s := range result.Steps {
		tool := "-"
		if s.ToolName != nil {
			tool = *s.ToolName
		}
		line, _, _ := strings.Cut(s.Observation, "\n")
		fmt.Fprintf(w, "  step %d  tool=%-11s parse_ok=%-5v %q\n", s.StepIdx, tool, s.ParseOK, line)
	}
}
