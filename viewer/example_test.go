package viewer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/parsers"
	"github.com/polyloop/polyloop/scripted"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
	"github.com/polyloop/polyloop/viewer"
)

// A viewer mounted beside the agents of a service, under /runs/: a run is
// driven on the store, then the runs page and a run's steps are fetched as
// a browser and a script would.
func ExampleNew() {
	store := seamstest.NewMemStore()
	tools, err := seams.NewRegistry(seams.Tool{
		Spec:    seams.ToolSpec{Name: "add", ReplayPolicy: events.ReplaySafe, Parameters: map[string]any{"type": "object"}},
		Handler: func(context.Context, map[string]any) (string, error) { return "42", nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	def := engine.Definition{Model: &scripted.Model{Turns: scripted.Replies(`TOOL add {"a": 2, "b": 40}`, "FINAL: 42")},
		Parser: parsers.ToolCalls{}, Store: store}
	if _, err := engine.Run(context.Background(), def, engine.Request{RunID: "sum-1", Tools: tools, ModelReplayPolicy: events.ReplaySafe}); err != nil {
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.Handle("/runs/", http.StripPrefix("/runs", viewer.New(store, viewer.Options{})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	page, err := http.Get(srv.URL + "/runs/")
	if err != nil {
		log.Fatal(err)
	}
	html, err := io.ReadAll(page.Body)
	page.Body.Close()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(page.Status, page.Header.Get("Content-Type"), "lists sum-1:", strings.Contains(string(html), "sum-1"))

	resp, err := http.Get(srv.URL + "/runs/api/steps?run=sum-1")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	var steps []struct {
		StepIdx     int     `json:"step_idx"`
		ToolName    *string `json:"tool_name"`
		Observation string  `json:"observation"`
		RawOutput   string  `json:"raw_output"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&steps); err != nil {
		log.Fatal(err)
	}
	for _, s := range steps {
		tool := "-"
		if s.ToolName != nil {
			tool = *s.ToolName
		}
		fmt.Printf("step %d: %s %q -> %q\n", s.StepIdx, tool, strings.TrimSpace(s.RawOutput), s.Observation)
	}
	// Output:
	// 200 OK text/html; charset=utf-8 lists sum-1: true
	// step 0: add "TOOL add {\"a\": 2, \"b\": 40}" -> "42"
	// step 1: - "FINAL: 42" -> ""
}
