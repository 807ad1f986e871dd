package otelsink_test

import (
	"context"
	"fmt"
	"log"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/otelsink"
	"github.com/polyloop/polyloop/parsers"
	"github.com/polyloop/polyloop/scripted"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// A sink as a run's Definition.Events: every durable event becomes part of
// a span, here exported to the SDK's in-memory exporter (a service passes
// an OTLP exporter). One tool call, then a final answer: two chat spans,
// one execute_tool span and the run's invoke_agent span, all one trace.
func ExampleNew() {
	exporter := tracetest.NewInMemoryExporter()
	sink := otelsink.New(exporter, otelsink.Options{AgentName: "calculator"})

	tools, err := seams.NewRegistry(seams.Tool{
		Spec:    seams.ToolSpec{Name: "add", ReplayPolicy: events.ReplaySafe, Parameters: map[string]any{"type": "object"}},
		Handler: func(context.Context, map[string]any) (string, error) { return "42", nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	def := engine.Definition{
		Model:  &scripted.Model{Turns: scripted.Replies(`TOOL add {"a": 2, "b": 40}`, "FINAL: 42")},
		Parser: parsers.ToolCalls{},
		Store:  seamstest.NewMemStore(),
		Events: sink,
	}
	ctx := context.Background()
	if _, err := engine.Run(ctx, def, engine.Request{RunID: "sum-1", Tools: tools, ModelReplayPolicy: events.ReplaySafe,
		ModelBinding: map[string]string{"model": "gpt-4o-mini"}}); err != nil {
		log.Fatal(err)
	}
	if err := sink.ForceFlush(ctx); err != nil { // drains the queue into the exporter
		log.Fatal(err)
	}
	spans := exporter.GetSpans()
	if err := sink.Shutdown(ctx); err != nil { // a service's last call of the sink
		log.Fatal(err)
	}

	traces := map[string]bool{}
	for _, span := range spans {
		traces[span.SpanContext.TraceID().String()] = true
		fmt.Println(span.Name)
	}
	fmt.Println(len(traces), "trace")
	// Output:
	// chat gpt-4o-mini
	// execute_tool add
	// chat gpt-4o-mini
	// invoke_agent calculator
	// 1 trace
}
