package otelsink_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/otelsink"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// process is one process's tracing: a sink whose spans wait in an SDK
// batch span processor (the SDK's default: exported every few seconds)
// before they reach exp.
type process struct {
	sink *otelsink.Sink
	exp  *tracetest.InMemoryExporter
	tp   *sdktrace.TracerProvider // the service's, under NewWithProvider
}

// tracing is how a sink reaches its exporter: through the provider New
// builds, or through the service's own.
type tracing struct {
	name  string
	start func(t *testing.T, o otelsink.Options) process
}

var tracings = []tracing{
	{"New", func(t *testing.T, o otelsink.Options) process {
		exp := tracetest.NewInMemoryExporter()
		return process{sink: otelsink.New(exp, o), exp: exp}
	}},
	{"NewWithProvider", func(t *testing.T, o otelsink.Options) process {
		exp := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
		sink, err := otelsink.NewWithProvider(tp, o)
		if err != nil {
			t.Fatal(err)
		}
		return process{sink: sink, exp: exp, tp: tp}
	}},
}

// crash is the process dying: what its exporter got so far is what left
// it; the rest, waiting in its batch processor, is lost. (Its goroutines
// are stopped once the test is over, and what they export then is not
// looked at.)
func (p process) crash(t *testing.T) tracetest.SpanStubs {
	got := p.exp.GetSpans()
	t.Cleanup(func() {
		p.sink.Shutdown(context.Background())
		if p.tp != nil {
			p.tp.Shutdown(context.Background())
		}
	})
	return got
}

// finish is the process shutting down as a service does: every span is
// exported.
func (p process) finish(t *testing.T) tracetest.SpanStubs {
	t.Helper()
	if err := p.sink.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := p.exp.GetSpans()
	if err := p.sink.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if p.tp != nil {
		if err := p.tp.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return got
}

// callerSpan is a service's request span around a Run or Resume.
func callerSpan(name string) (context.Context, trace.SpanContext) {
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("service").Start(context.Background(), name)
	return ctx, span.SpanContext()
}

// wholeTrace checks that the trace of the run's span holds every span of
// the run — a chat span per model call (response ids call-0 to call-3), an
// execute_tool span per action, one run span — each span id's copies the
// same span, and every parent exported (the run span's being the caller's
// span, or none). It returns the trace's spans, one per span id.
func wholeTrace(t *testing.T, all tracetest.SpanStubs, caller trace.SpanContext) map[trace.SpanID]tracetest.SpanStub {
	t.Helper()
	roots := byName(all)["invoke_agent polyloop"]
	if len(roots) == 0 {
		t.Fatalf("no run span among %v", keys(byName(all)))
	}
	tid := roots[len(roots)-1].SpanContext.TraceID()
	ids := map[trace.SpanID]tracetest.SpanStub{}
	for _, s := range all {
		if s.SpanContext.TraceID() != tid {
			continue
		}
		id := s.SpanContext.SpanID()
		if have, ok := ids[id]; ok {
			if diff := sameSpan(have, s); diff != "" {
				t.Errorf("span %s was exported twice, differently: %s", id, diff)
			}
			continue
		}
		ids[id] = s
	}
	names := map[string]int{}
	var responses []string
	for _, s := range ids {
		names[s.Name]++
		if v, ok := attr(s, "gen_ai.response.id"); ok {
			responses = append(responses, v.AsString())
		}
		switch p := s.Parent.SpanID(); {
		case s.Name == "invoke_agent polyloop":
			if s.Parent.SpanID() != caller.SpanID() || caller.IsValid() && s.Parent.TraceID() != caller.TraceID() {
				t.Errorf("the run span's parent is %s, want the caller's span %s", s.Parent.SpanID(), caller.SpanID())
			}
		case !p.IsValid():
			t.Errorf("%s has no parent", s.Name)
		default:
			if _, ok := ids[p]; !ok {
				t.Errorf("%s's parent %s is not in the trace", s.Name, p)
			}
		}
	}
	slices.Sort(responses)
	if want := map[string]int{"invoke_agent polyloop": 1, "chat qwen3": 4, "execute_tool count": 3}; fmt.Sprint(names) != fmt.Sprint(want) ||
		strings.Join(responses, ",") != "call-0,call-1,call-2,call-3" {
		t.Errorf("the run's trace holds %v (model calls %v), want %v (call-0 to call-3)", names, responses, want)
	}
	return ids
}

// sameSpan says how two exports of one span id differ ("" if they do not).
func sameSpan(a, b tracetest.SpanStub) string {
	attrs := func(s tracetest.SpanStub) string {
		var out []string
		for _, kv := range s.Attributes {
			out = append(out, string(kv.Key)+"="+kv.Value.Emit())
		}
		slices.Sort(out)
		return strings.Join(out, " ")
	}
	switch {
	case a.Name != b.Name:
		return a.Name + " / " + b.Name
	case a.Parent.SpanID() != b.Parent.SpanID():
		return "parents " + a.Parent.SpanID().String() + " / " + b.Parent.SpanID().String()
	case !a.StartTime.Equal(b.StartTime) || !a.EndTime.Equal(b.EndTime):
		return fmt.Sprintf("%s: times %v-%v / %v-%v", a.Name, a.StartTime, a.EndTime, b.StartTime, b.EndTime)
	case attrs(a) != attrs(b):
		return a.Name + ": " + attrs(a) + " / " + attrs(b)
	case len(a.Events) != len(b.Events) || a.Status != b.Status:
		return a.Name + ": events or status"
	}
	return ""
}

// TestACrashedProcessLosesNoSpans: a process killed at step 2 exported
// none of the spans its batch processor held; the process that resumes
// the run exports them, so the run's trace holds every step — with or
// without a caller's span around Run and Resume.
func TestACrashedProcessLosesNoSpans(t *testing.T) {
	for _, tr := range tracings {
		for _, withCaller := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/caller=%t", tr.name, withCaller), func(t *testing.T) {
				store := &seamstest.MemStore{}
				o := otelsink.Options{Runs: store}
				runCtx, resumeCtx := context.Background(), context.Background()
				var caller trace.SpanContext
				if withCaller {
					runCtx, _ = callerSpan("POST /runs")
					resumeCtx, caller = callerSpan("resume")
				}
				first := tr.start(t, o)
				def, req := agent(&proptest.CrashingStore{Inner: store, After: 4}, first.sink, script())
				if _, err := engine.Run(runCtx, def, req); !errors.Is(err, proptest.ErrCrashed) {
					t.Fatalf("crash: %v", err)
				}
				crashed := first.crash(t)
				second := tr.start(t, o)
				def, req = agent(store, second.sink, script())
				if r, err := engine.Resume(resumeCtx, def, req); err != nil || r.StopReason != events.StopAgentFinished {
					t.Fatalf("resume: %v %v", r.StopReason, err)
				}
				resumed := second.finish(t)
				wholeTrace(t, append(crashed, resumed...), caller)
				t.Logf("the crashed process exported %d spans, the resuming one %d", len(crashed), len(resumed))
			})
		}
	}
}

// TestTheRunSpanNestsUnderTheCallersSpan: a run driven under a service's
// request span is part of the request's trace, its run span a child of
// the request's span; a run driven without one is a trace of its own,
// whose id derives from the run id.
func TestTheRunSpanNestsUnderTheCallersSpan(t *testing.T) {
	for _, tr := range tracings {
		for _, withCaller := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/caller=%t", tr.name, withCaller), func(t *testing.T) {
				ctx, caller := context.Background(), trace.SpanContext{}
				if withCaller {
					ctx, caller = callerSpan("POST /runs")
				}
				p := tr.start(t, otelsink.Options{})
				def, req := agent(&seamstest.MemStore{}, p.sink, script())
				if r, err := engine.Run(ctx, def, req); err != nil || r.StopReason != events.StopAgentFinished {
					t.Fatalf("%v %v", r.StopReason, err)
				}
				got := p.finish(t)
				ids := wholeTrace(t, got, caller)
				if len(ids) != len(got) {
					t.Errorf("%d spans exported, %d in the run's trace", len(got), len(ids))
				}
				root := byName(got)["invoke_agent polyloop"][0]
				if withCaller && root.SpanContext.TraceID() != caller.TraceID() {
					t.Errorf("the run's trace is %s, the caller's %s", root.SpanContext.TraceID(), caller.TraceID())
				}
				if tr.name == "New" && !withCaller {
					// Another sink, another process: the same trace id.
					again := tr.start(t, otelsink.Options{})
					def, req := agent(&seamstest.MemStore{}, again.sink, script()[3:])
					if _, err := engine.Run(context.Background(), def, req); err != nil {
						t.Fatal(err)
					}
					if other := byName(again.finish(t))["invoke_agent polyloop"][0]; other.SpanContext.TraceID() != root.SpanContext.TraceID() {
						t.Errorf("run %q traced as %s and as %s", req.RunID, root.SpanContext.TraceID(), other.SpanContext.TraceID())
					}
				}
			})
		}
	}
}

// TestAReplayedCallIsMarked: a model call or an action whose intent was
// durable before a crash, made again by the resume, has a span marked
// polyloop.replayed that starts when the resume made it again, not before
// the downtime — whether the run resumes in another process or in the one
// whose store failed.
func TestAReplayedCallIsMarked(t *testing.T) {
	const downtime = 80 * time.Millisecond
	for _, tr := range tracings {
		for _, c := range []struct {
			name     string
			after    int    // appends before the crash
			replayed string // the span made again
			sameSink bool
		}{
			{"a model call, in another process", 4, "chat qwen3", false},
			{"an action, in another process", 5, "execute_tool count", false},
			{"a model call, in the same process", 4, "chat qwen3", true},
			{"an action, in the same process", 5, "execute_tool count", true},
		} {
			t.Run(tr.name+"/"+c.name, func(t *testing.T) {
				store := &seamstest.MemStore{}
				o := otelsink.Options{Runs: store}
				first := tr.start(t, o)
				def, req := agent(&proptest.CrashingStore{Inner: store, After: c.after}, first.sink, script())
				if _, err := engine.Run(context.Background(), def, req); !errors.Is(err, proptest.ErrCrashed) {
					t.Fatalf("crash: %v", err)
				}
				atCrash, _ := store.Load(context.Background(), "traced")
				replayedID := "" // the last intent the crash left without its result
				for _, env := range atCrash {
					if in, ok := env.Event.(events.Intent); ok {
						replayedID = in.ResultID
					}
				}
				time.Sleep(downtime)
				resumedAt := time.Now()
				second := first
				if !c.sameSink {
					second = tr.start(t, o)
				}
				def, req = agent(store, second.sink, script())
				if _, err := engine.Resume(context.Background(), def, req); err != nil {
					t.Fatal(err)
				}
				var got tracetest.SpanStubs
				if !c.sameSink {
					got = first.crash(t)
				}
				got = append(got, second.finish(t)...)
				marked := 0
				for id, s := range wholeTrace(t, got, trace.SpanContext{}) {
					v, ok := attr(s, "polyloop.replayed")
					call, _ := attr(s, "gen_ai.response.id")
					tool, _ := attr(s, "gen_ai.tool.call.id")
					this := s.Name == c.replayed && (call.AsString() == "call-2" || tool.AsString() == replayedID) // the model's third reply is call-2
					switch {
					case this && (!ok || !v.AsBool()):
						t.Errorf("the replayed %s (%s) is not marked", s.Name, id)
					case !this && ok:
						t.Errorf("%s (%s) was not replayed and is marked polyloop.replayed=%v", s.Name, id, v.Emit())
					}
					// A span's end is its result's durable time, a ULID's, in whole
					// milliseconds; a replay's start is not after it.
					if this && s.StartTime.Before(resumedAt.Truncate(time.Millisecond)) {
						t.Errorf("the replayed %s starts at %v, before the resume at %v (%v before)", s.Name,
							s.StartTime, resumedAt, resumedAt.Sub(s.StartTime))
					}
					if this {
						marked++
					}
				}
				if marked != 1 {
					t.Errorf("%d spans of the replayed call, want 1", marked)
				}
			})
		}
	}
}

// TestNewWithProviderRefusesBadInput: no provider, or a resource the
// provider's would silently replace, is refused, naming what is wrong.
func TestNewWithProviderRefusesBadInput(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	for _, c := range []struct {
		name string
		tp   trace.TracerProvider
		o    otelsink.Options
		want string
	}{
		{"no provider", nil, otelsink.Options{}, "the tracer provider is nil"},
		{"a resource", tp, otelsink.Options{Resource: resource.Default()}, "Options.Resource is set"},
	} {
		t.Run(c.name, func(t *testing.T) {
			sink, err := otelsink.NewWithProvider(c.tp, c.o)
			if err == nil || !strings.Contains(err.Error(), c.want) || sink != nil {
				t.Fatalf("NewWithProvider: %v, %v; want an error saying %q", sink, err, c.want)
			}
		})
	}
}

// stuckReader is a store that never answers a read before its context
// ends.
type stuckReader struct{ seams.RunReader }

func (stuckReader) Load(ctx context.Context, _ string) ([]events.Envelope, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestAStoreThatDoesNotAnswerHoldsNoSpans: the sink reads a resumed run's
// log on its one goroutine; a store that does not answer costs the spans
// of the steps before the resume, after Options.RunsTimeout, and not
// every span after it.
func TestAStoreThatDoesNotAnswerHoldsNoSpans(t *testing.T) {
	store := seamstest.NewMemStore()
	def, req := agent(&proptest.CrashingStore{Inner: store, After: 4}, nil, script())
	if _, err := engine.Run(context.Background(), def, req); !errors.Is(err, proptest.ErrCrashed) {
		t.Fatalf("the first process: %v, want a crash", err)
	}
	exp := tracetest.NewInMemoryExporter()
	sink := otelsink.New(exp, otelsink.Options{Runs: stuckReader{store}, RunsTimeout: 50 * time.Millisecond})
	def, req = agent(store, sink, script())
	if _, err := engine.Resume(context.Background(), def, req); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sink.ForceFlush(ctx); err != nil {
		t.Fatalf("the sink is still reading the store: %v", err)
	}
	got := byName(exp.GetSpans())
	if len(got["invoke_agent polyloop"]) != 1 || len(got["execute_tool count"]) == 0 {
		t.Fatalf("spans after the resume: %v, want the run's and the resumed steps'", keys(got))
	}
	sink.Shutdown(context.Background())
}
