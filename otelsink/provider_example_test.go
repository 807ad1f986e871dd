package otelsink_test

import (
	"context"
	"fmt"
	"log"
	"slices"
	"strings"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/otelsink"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// A service traces its runs with its own TracerProvider: a run started
// under a request's span is part of the request's trace.
func ExampleNewWithProvider() {
	exp := tracetest.NewInMemoryExporter() // the service's exporter: OTLP, say
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	sink, err := otelsink.NewWithProvider(tp, otelsink.Options{AgentName: "counter"})
	if err != nil {
		log.Fatal(err)
	}

	ctx, request := tp.Tracer("service").Start(context.Background(), "POST /runs")
	def := engine.Definition{Model: &seamstest.Model{Turns: seamstest.Replies(`TOOL count {"dir":"a"}`, "FINAL: 3 files")},
		Parser: seamstest.Parser{}, Store: &seamstest.MemStore{}, Events: sink}
	req := engine.Request{RunID: "counting", Tools: tools, Executor: tools.Executor(), ModelReplayPolicy: events.ReplaySafe, ModelBinding: map[string]string{"model": "qwen3"},
		Budget: engine.Budget{MaxSteps: 4, MaxActions: 4, MaxConsecutiveParseFailures: 1, MaxPromptChars: 10_000}}
	if r, err := engine.Run(ctx, def, req); err != nil || r.StopReason != events.StopAgentFinished {
		log.Fatal(r.StopReason, err)
	}
	request.End()
	if err := sink.Shutdown(context.Background()); err != nil { // the provider stays the service's
		log.Fatal(err)
	}

	names := map[string]string{}
	for _, s := range exp.GetSpans() {
		names[s.SpanContext.SpanID().String()] = s.Name
	}
	var lines []string // in no particular order: the sink turns events into spans on its own goroutine
	for _, s := range exp.GetSpans() {
		lines = append(lines, fmt.Sprintf("%s, under %q", s.Name, names[s.Parent.SpanID().String()]))
	}
	slices.Sort(lines)
	fmt.Println(strings.Join(lines, "\n"))
	// Output:
	// POST /runs, under ""
	// chat qwen3, under "invoke_agent counter"
	// chat qwen3, under "invoke_agent counter"
	// execute_tool count, under "invoke_agent counter"
	// invoke_agent counter, under "POST /runs"
}
