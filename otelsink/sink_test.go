package otelsink_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/resource"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/otelsink"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

var tools = func() *seams.Registry {
	r, err := seams.NewRegistry(
		seams.Tool{Spec: seams.ToolSpec{Name: "count", ReplayPolicy: events.ReplaySafe,
			Parameters: map[string]any{"type": "object", "required": []string{"dir"}}},
			Handler: func(context.Context, map[string]any) (string, error) { return "3 files", nil }},
	)
	if err != nil {
		panic(err)
	}
	return r
}()

func usage(in, out int64) *events.Usage { return &events.Usage{InputTokens: &in, OutputTokens: &out} }

// script: two tool calls with usage, a rejected call, then an answer.
func script() []seamstest.Turn {
	return []seamstest.Turn{
		{Reply: events.ModelReply{CallID: "call-0", Content: `TOOL count {"dir":"a"}`, Usage: usage(100, 10)}},
		{Reply: events.ModelReply{CallID: "call-1", Content: `TOOL count {}`, Usage: usage(120, 12)}}, // rejected: dir is required
		{Reply: events.ModelReply{CallID: "call-2", Content: `TOOL count {"dir":"b"}`, Usage: usage(150, 15)}},
		{Reply: events.ModelReply{CallID: "call-3", Content: `FINAL: 6 files`, Usage: usage(170, 5)}},
	}
}

func agent(store seams.RunStore, sink seams.EventSink, turns []seamstest.Turn) (engine.Definition, engine.Request) {
	return engine.Definition{Model: &seamstest.Model{Turns: turns}, Parser: seamstest.Parser{}, Store: store, Events: sink},
		engine.Request{RunID: "traced", Tools: tools, Executor: tools.Executor(), ModelReplayPolicy: events.ReplaySafe,
			ModelBinding: map[string]string{"model": "qwen3"},
			Budget:       engine.Budget{MaxSteps: 10, MaxActions: 10, MaxConsecutiveParseFailures: 2, MaxPromptChars: 100_000}}
}

// spans runs f with a fresh sink on tracetest's in-memory exporter and
// returns what it exported.
func spans(t *testing.T, o otelsink.Options, f func(sink *otelsink.Sink)) tracetest.SpanStubs {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	sink := otelsink.New(exp, o)
	f(sink)
	if err := sink.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := exp.GetSpans() // before Shutdown, which empties the exporter
	if err := sink.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	return got
}

func attr(s tracetest.SpanStub, k string) (attribute.Value, bool) {
	for _, kv := range s.Attributes {
		if string(kv.Key) == k {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

func byName(ss tracetest.SpanStubs) map[string][]tracetest.SpanStub {
	out := map[string][]tracetest.SpanStub{}
	for _, s := range ss {
		out[s.Name] = append(out[s.Name], s)
	}
	return out
}

// TestANormalRunIsOneTrace: one invoke_agent span, a chat span per model
// call and an execute_tool span per action, all in one trace under the
// run's span, with the GenAI attributes.
func TestANormalRunIsOneTrace(t *testing.T) {
	got := spans(t, otelsink.Options{AgentName: "counter"}, func(sink *otelsink.Sink) {
		def, req := agent(&seamstest.MemStore{}, sink, script())
		if r, err := engine.Run(context.Background(), def, req); err != nil || r.StopReason != events.StopAgentFinished {
			t.Fatalf("%v %v", r.StopReason, err)
		}
	})
	names := byName(got)
	if len(names["invoke_agent counter"]) != 1 || len(names["chat qwen3"]) != 4 || len(names["execute_tool count"]) != 3 {
		t.Fatalf("spans: %v", keys(names))
	}
	root := names["invoke_agent counter"][0]
	for _, s := range got {
		if s.SpanContext.TraceID() != root.SpanContext.TraceID() {
			t.Fatalf("%s is in another trace", s.Name)
		}
		if s.Name != root.Name && s.Parent.SpanID() != root.SpanContext.SpanID() {
			t.Fatalf("%s is not under the run's span", s.Name)
		}
		if s.EndTime.Before(s.StartTime) {
			t.Fatalf("%s ends before it starts", s.Name)
		}
	}
	for k, want := range map[string]string{"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "counter",
		"gen_ai.conversation.id": "traced", "polyloop.stop_reason": "agent_finished"} {
		if v, _ := attr(root, k); v.AsString() != want {
			t.Errorf("run span %s = %q, want %q", k, v.AsString(), want)
		}
	}
	chat := names["chat qwen3"][0]
	if v, _ := attr(chat, "gen_ai.response.id"); v.AsString() != "call-0" {
		t.Errorf("chat response id %q", v.AsString())
	}
	if v, _ := attr(chat, "gen_ai.usage.input_tokens"); v.AsInt64() != 100 {
		t.Errorf("input tokens %d", v.AsInt64())
	}
	if v, _ := attr(chat, "gen_ai.request.model"); v.AsString() != "qwen3" {
		t.Errorf("model %q", v.AsString())
	}
	rejected := 0
	for _, s := range names["execute_tool count"] {
		if v, _ := attr(s, "error.type"); v.AsString() == "tool_call_rejected" {
			rejected++
			if s.Status.Code != codes.Error {
				t.Error("a rejected call's span is not an error")
			}
		} else if id, ok := attr(s, "gen_ai.tool.call.id"); !ok || id.AsString() == "" {
			t.Error("an executed tool span has no call id")
		}
	}
	if rejected != 1 {
		t.Errorf("%d rejected tool spans, want 1", rejected)
	}
	if _, ok := attr(chat, "polyloop.reply.content"); ok {
		t.Error("reply content in a span without IncludeContent")
	}
}

func keys(m map[string][]tracetest.SpanStub) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		out[k] = len(v)
	}
	return out
}

// TestACrashedRunContinuesOneTrace: a run crashed at every write in turn
// and resumed by another sink (another process's): together they emitted
// one trace holding every span, one run span. The crashed process exported
// all it made here (its store failed, the process lived on), and the
// resuming one exports the spans of the steps before the resume again:
// the same spans, each copy of a span id equal to the other.
func TestACrashedRunContinuesOneTrace(t *testing.T) {
	crashes := 0
	for crash := 1; ; crash++ {
		store := &seamstest.MemStore{}
		finished := false
		first := spans(t, otelsink.Options{}, func(sink *otelsink.Sink) {
			def, req := agent(&proptest.CrashingStore{Inner: store, After: crash}, sink, script())
			_, err := engine.Run(context.Background(), def, req)
			if finished = err == nil; !finished && !errors.Is(err, proptest.ErrCrashed) {
				t.Fatalf("crash %d: %v", crash, err)
			}
		})
		if finished {
			break // every write of the run has been a crash point
		}
		crashes++
		second := spans(t, otelsink.Options{Runs: store}, func(sink *otelsink.Sink) {
			def, req := agent(store, sink, script())
			if _, err := engine.Resume(context.Background(), def, req); err != nil {
				t.Fatalf("crash %d: resume: %v", crash, err)
			}
		})
		all := append(first, second...)
		roots := 0
		for _, s := range all {
			if s.SpanContext.TraceID() != all[0].SpanContext.TraceID() {
				t.Fatalf("crash %d: two traces", crash)
			}
			if s.Name == "invoke_agent polyloop" {
				roots++
			}
		}
		if ids := wholeTrace(t, all, trace.SpanContext{}); roots != 1 || len(ids) != 1+4+3 || len(second) != len(ids) {
			t.Fatalf("crash %d: %d run spans, %d spans, %d of them from the resuming process (%v)", crash, roots, len(ids), len(second), keys(byName(all)))
		}
		stream, _ := store.Load(context.Background(), "traced")
		if root := byName(second)["invoke_agent polyloop"][0]; !root.StartTime.Equal(stream[0].Time()) {
			t.Fatalf("crash %d: the resumed run's span starts at %v, the run at %v", crash, root.StartTime, stream[0].Time())
		}
	}
	if crashes < 5 {
		t.Fatalf("only %d crash points", crashes)
	}
	t.Logf("%d crash points, each one trace with every span once", crashes)
}

// TestFailuresAndBudgetsAreVisible: a failed model call's span carries
// error.type; a token budget stop is the run span's stop reason.
func TestFailuresAndBudgetsAreVisible(t *testing.T) {
	got := spans(t, otelsink.Options{}, func(sink *otelsink.Sink) {
		def, req := agent(&seamstest.MemStore{}, sink, []seamstest.Turn{{Err: errors.New("503")}})
		if r, _ := engine.Run(context.Background(), def, req); r.StopReason != events.StopLLMError {
			t.Fatalf("stop %s", r.StopReason)
		}
	})
	chat := byName(got)["chat qwen3"]
	if v, _ := attr(chat[0], "error.type"); len(chat) != 1 || v.AsString() != "model_call_failed" || chat[0].Status.Code != codes.Error {
		t.Fatalf("failed call span: %+v", chat)
	}
	got = spans(t, otelsink.Options{IncludeContent: true}, func(sink *otelsink.Sink) {
		def, req := agent(&seamstest.MemStore{}, sink, script())
		req.Budget.MaxTotalTokens = 200
		if r, _ := engine.Run(context.Background(), def, req); r.StopReason != events.StopTokenBudget {
			t.Fatalf("stop %s", r.StopReason)
		}
	})
	root := byName(got)["invoke_agent polyloop"][0]
	if v, _ := attr(root, "polyloop.stop_reason"); v.AsString() != "token_budget" {
		t.Fatalf("stop reason %q", v.AsString())
	}
	if v, _ := attr(byName(got)["chat qwen3"][0], "polyloop.reply.content"); v.AsString() != `TOOL count {"dir":"a"}` {
		t.Fatalf("content with IncludeContent: %q", v.AsString())
	}
}

// TestContentGoesIntoSpansOnlyWhenIncluded: replies, tool arguments and
// observations may hold personal or secret data, so no span carries them
// unless Options.IncludeContent says so; with it, each is on its span.
func TestContentGoesIntoSpansOnlyWhenIncluded(t *testing.T) {
	content := map[string]string{ // attribute: the span it belongs on
		"polyloop.reply.content":     "chat qwen3",
		"gen_ai.tool.call.arguments": "execute_tool count",
		"gen_ai.tool.call.result":    "execute_tool count",
	}
	for _, include := range []bool{false, true} {
		got := spans(t, otelsink.Options{IncludeContent: include}, func(sink *otelsink.Sink) {
			def, req := agent(&seamstest.MemStore{}, sink, script())
			if r, err := engine.Run(context.Background(), def, req); err != nil || r.StopReason != events.StopAgentFinished {
				t.Fatalf("%v %v", r.StopReason, err)
			}
		})
		for key, name := range content {
			values := map[string]bool{}
			for _, s := range got {
				if v, ok := attr(s, key); ok {
					if s.Name != name {
						t.Errorf("IncludeContent=%v: %s on a %q span", include, key, s.Name)
					}
					values[v.AsString()] = true
				}
			}
			if !include && len(values) > 0 {
				t.Errorf("IncludeContent=false: %s in spans: %v", key, keysOf(values))
			}
			if include && len(values) == 0 {
				t.Errorf("IncludeContent=true: no span carries %s", key)
			}
		}
		if !include {
			continue
		}
		tool := byName(got)["execute_tool count"][0]
		if v, _ := attr(tool, "gen_ai.tool.call.arguments"); v.AsString() != `{"dir":"a"}` {
			t.Errorf("the first tool call's arguments: %q", v.AsString())
		}
		if v, _ := attr(tool, "gen_ai.tool.call.result"); v.AsString() != "3 files" {
			t.Errorf("the first tool call's result: %q", v.AsString())
		}
	}
}

func keysOf(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestAChatSpanLastsAsLongAsItsModelCall: a chat span starts when its
// call's result id was minted (just before the intent was written), not
// when the result was: a model call of 20 ms makes a span of 20 ms or more.
func TestAChatSpanLastsAsLongAsItsModelCall(t *testing.T) {
	const call = 20 * time.Millisecond
	got := spans(t, otelsink.Options{}, func(sink *otelsink.Sink) {
		def, req := agent(&seamstest.MemStore{}, sink, script())
		def.Model.(*seamstest.Model).OnCall = func(seams.ModelCall) { time.Sleep(call) }
		if r, err := engine.Run(context.Background(), def, req); err != nil || r.StopReason != events.StopAgentFinished {
			t.Fatalf("%v %v", r.StopReason, err)
		}
	})
	chats := byName(got)["chat qwen3"]
	if len(chats) != 4 {
		t.Fatalf("%d chat spans, want 4", len(chats))
	}
	for _, s := range chats {
		// Both ends are read from ULIDs, in whole milliseconds.
		if d := s.EndTime.Sub(s.StartTime); d < call-time.Millisecond {
			t.Errorf("a chat span of a %v model call lasts %v", call, d)
		}
	}
}

// TestTheResourceDescribesTheService: Options.Resource is every span's
// resource.
func TestTheResourceDescribesTheService(t *testing.T) {
	service := resource.NewSchemaless(attribute.String("service.name", "counting-agents"))
	got := spans(t, otelsink.Options{Resource: service}, func(sink *otelsink.Sink) {
		def, req := agent(&seamstest.MemStore{}, sink, script())
		if r, err := engine.Run(context.Background(), def, req); err != nil || r.StopReason != events.StopAgentFinished {
			t.Fatalf("%v %v", r.StopReason, err)
		}
	})
	if len(got) == 0 {
		t.Fatal("no spans")
	}
	for _, s := range got {
		if v, ok := s.Resource.Set().Value("service.name"); !ok || v.AsString() != "counting-agents" {
			t.Fatalf("%s: service.name %q, want the resource's", s.Name, v.AsString())
		}
	}
}

// blockedRuns stalls the sink's worker on its first lookup.
type blockedRuns struct{ release chan struct{} }

func (b blockedRuns) Runs(context.Context) ([]seams.RunInfo, error) { return nil, nil }
func (b blockedRuns) Load(context.Context, string) ([]events.Envelope, error) {
	<-b.release
	return nil, nil
}

// TestTheSinkNeverBlocks: with its worker stalled, Emit returns at once;
// events beyond the queue are dropped, counted and reported.
func TestTheSinkNeverBlocks(t *testing.T) {
	release := make(chan struct{})
	sink := otelsink.New(tracetest.NewInMemoryExporter(), otelsink.Options{QueueSize: 4, Runs: blockedRuns{release}})
	// Not a run_started: the worker looks the run's start up in Runs, which
	// blocks until release, so the worker is stalled on the first event and
	// the queue holds at most 4 more (a run_started never reaches Runs, and
	// the worker kept up as fast as it could — how many were dropped was a
	// matter of scheduling).
	env := events.Envelope{Event: events.Intent{RunID: "r", IntentKind: events.IntentModelCall, ResultID: "m0"}}
	dropped := 0
	for range 100 {
		if errors.Is(sink.Emit(context.Background(), env), otelsink.ErrDropped) {
			dropped++
		}
	}
	close(release)
	if err := sink.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if dropped < 100-5 || sink.Dropped() != int64(dropped) {
		t.Fatalf("%d dropped, sink counted %d", dropped, sink.Dropped())
	}
}

// TestShutdownWhileRunsEmit: a service shutting its sink down while runs
// still emit loses those events (counted), without a race or a panic.
func TestShutdownWhileRunsEmit(t *testing.T) {
	sink := otelsink.New(tracetest.NewInMemoryExporter(), otelsink.Options{QueueSize: 8})
	env := events.Envelope{Event: events.RunStarted{RunID: "r"}}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 200 {
				sink.Emit(context.Background(), env)
			}
		})
	}
	if err := sink.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err := sink.Emit(context.Background(), env); !errors.Is(err, otelsink.ErrDropped) {
		t.Fatalf("emit after shutdown: %v", err)
	}
	if err := sink.ForceFlush(context.Background()); err != nil {
		t.Fatalf("flush after shutdown: %v", err)
	}
}
