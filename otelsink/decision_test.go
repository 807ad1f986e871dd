package otelsink_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/otelsink"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// approvalTools: refund needs a person's approval for every call; pay is
// a never tool.
var approvalTools = func() *seams.Registry {
	ok := func(context.Context, map[string]any) (string, error) { return "done", nil }
	r, err := seams.NewRegistry(
		seams.Tool{Spec: seams.ToolSpec{Name: "refund", RequiresApproval: true,
			Parameters: map[string]any{"type": "object", "required": []string{"amount"}}}, Handler: ok},
		seams.Tool{Spec: seams.ToolSpec{Name: "pay", Parameters: map[string]any{"type": "object", "required": []string{"amount"}}}, Handler: ok},
	)
	if err != nil {
		panic(err)
	}
	return r
}()

func approvalAgent(store seams.RunStore, sink seams.EventSink, replies ...string) (engine.Definition, engine.Request) {
	def, req := agent(store, sink, seamstest.Replies(replies...))
	req.Tools, req.Executor = approvalTools, approvalTools.Executor()
	return def, req
}

// awaitingCall runs or resumes until the run waits for a person and
// returns the pending call.
func awaitingCall(t *testing.T, drive func(context.Context, engine.Definition, engine.Request) (events.RunResult, error),
	def engine.Definition, req engine.Request) recovery.PendingCall {
	t.Helper()
	_, err := drive(context.Background(), def, req)
	var aw *engine.AwaitingError
	if !errors.As(err, &aw) {
		t.Fatalf("%v, want the run awaiting a decision", err)
	}
	return aw.Calls[0]
}

func eventAttr(e sdktrace.Event, k string) (attribute.Value, bool) {
	for _, kv := range e.Attributes {
		if string(kv.Key) == k {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// writtenAt is when the run's log wrote its events of kind k on call.
func writtenAt(t *testing.T, store seams.RunStore, k events.Kind, call string) []time.Time {
	t.Helper()
	stream, err := store.Load(context.Background(), "traced")
	if err != nil {
		t.Fatal(err)
	}
	var out []time.Time
	for _, env := range stream {
		switch ev := env.Event.(type) {
		case events.Intent:
			if k == events.KindIntent && ev.ResultID == call && ev.Awaits != "" {
				out = append(out, env.Time())
			}
		case events.Decision:
			if k == events.KindDecision && ev.ResultID == call {
				out = append(out, env.Time())
			}
		}
	}
	return out
}

// toolSpan is the one span named name.
func toolSpan(t *testing.T, got tracetest.SpanStubs, name string) tracetest.SpanStub {
	t.Helper()
	spans := byName(got)[name]
	if len(spans) != 1 {
		t.Fatalf("%d %q spans (%v)", len(spans), name, keys(byName(got)))
	}
	return spans[0]
}

// TestTheWaitForApprovalIsOnTheToolSpan: the execute_tool span of an
// action that waited for approval carries an awaiting event at the
// awaiting intent's time and a decision event at the decision's (with the
// verdict, who, and how long the run waited), however the sink learnt of
// the decision: emitted to it by the caller of Decide, read from the log
// when the step completes, or read from the log by another process's sink
// that resumed the run. Without either it knows only the wait's start.
func TestTheWaitForApprovalIsOnTheToolSpan(t *testing.T) {
	const wait = 30 * time.Millisecond
	for _, c := range []struct {
		name         string
		emit         bool // the caller emits Decide's envelope to the sink
		runs         bool // Options.Runs is the store
		otherProcess bool // the run is resumed under a new sink
		wantDecision bool
	}{
		{"the caller emits the decision", true, false, false, true},
		{"the sink reads it from the log", false, true, false, true},
		{"another process's sink reads it from the log", false, true, true, true},
		{"the sink has neither", false, false, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			store := &seamstest.MemStore{}
			o := otelsink.Options{}
			if c.runs {
				o.Runs = store
			}
			var pending recovery.PendingCall
			var decision events.Envelope
			decide := func(sink *otelsink.Sink) {
				time.Sleep(wait) // a person takes a while
				var err error
				decision, err = engine.Decide(ctx, store, events.Decision{RunID: "traced", ResultID: pending.Call,
					Verdict: events.VerdictApproved, By: "ana", Note: "fine"})
				if err != nil {
					t.Fatal(err)
				}
				if c.emit {
					if err := sink.Emit(ctx, decision); err != nil {
						t.Fatal(err)
					}
				}
			}
			finish := func(sink *otelsink.Sink) {
				def, req := approvalAgent(store, sink, `TOOL refund {"amount":40}`, "FINAL: refunded")
				if r, err := engine.Resume(ctx, def, req); err != nil || r.StopReason != events.StopAgentFinished {
					t.Fatalf("resume: %v %v", r.StopReason, err)
				}
			}
			var got tracetest.SpanStubs
			if c.otherProcess {
				first := spans(t, o, func(sink *otelsink.Sink) {
					def, req := approvalAgent(store, sink, `TOOL refund {"amount":40}`, "FINAL: refunded")
					pending = awaitingCall(t, engine.Run, def, req)
				})
				decide(nil)
				got = append(first, spans(t, o, finish)...)
			} else {
				got = spans(t, o, func(sink *otelsink.Sink) {
					def, req := approvalAgent(store, sink, `TOOL refund {"amount":40}`, "FINAL: refunded")
					pending = awaitingCall(t, engine.Run, def, req)
					decide(sink)
					finish(sink)
				})
			}
			span := toolSpan(t, got, "execute_tool refund")
			awaitedAt, decidedAt := writtenAt(t, store, events.KindIntent, pending.Call), writtenAt(t, store, events.KindDecision, pending.Call)
			if len(awaitedAt) != 1 || len(decidedAt) != 1 {
				t.Fatalf("the log holds %d awaiting intents and %d decisions", len(awaitedAt), len(decidedAt))
			}
			want := 2
			if !c.wantDecision {
				want = 1
			}
			if len(span.Events) != want {
				t.Fatalf("%d span events (%+v), want %d", len(span.Events), span.Events, want)
			}
			awaiting := span.Events[0]
			if awaiting.Name != "polyloop.awaiting" || !awaiting.Time.Equal(awaitedAt[0]) {
				t.Fatalf("first event %q at %v, want polyloop.awaiting at %v", awaiting.Name, awaiting.Time, awaitedAt[0])
			}
			for k, v := range map[string]string{"polyloop.awaits": "approval", "gen_ai.tool.name": "refund", "gen_ai.tool.call.id": pending.Call} {
				if got, _ := eventAttr(awaiting, k); got.AsString() != v {
					t.Errorf("awaiting event %s = %q, want %q", k, got.AsString(), v)
				}
			}
			if awaiting.Time.Before(span.StartTime) || span.EndTime.Before(awaiting.Time) {
				t.Errorf("the awaiting event at %v is outside its span (%v to %v)", awaiting.Time, span.StartTime, span.EndTime)
			}
			if !c.wantDecision {
				return
			}
			d := span.Events[1]
			if d.Name != "polyloop.decision" || !d.Time.Equal(decidedAt[0]) {
				t.Fatalf("second event %q at %v, want polyloop.decision at %v", d.Name, d.Time, decidedAt[0])
			}
			for k, v := range map[string]string{"polyloop.decision.verdict": "approved", "polyloop.decision.by": "ana", "gen_ai.tool.call.id": pending.Call} {
				if got, _ := eventAttr(d, k); got.AsString() != v {
					t.Errorf("decision event %s = %q, want %q", k, got.AsString(), v)
				}
			}
			waited, _ := eventAttr(d, "polyloop.decision.waited_ms")
			if w := decidedAt[0].Sub(awaitedAt[0]).Milliseconds(); waited.AsInt64() != w || w < wait.Milliseconds() {
				t.Errorf("waited_ms %d, the log says %d ms (at least %d)", waited.AsInt64(), w, wait.Milliseconds())
			}
			if span.EndTime.Before(d.Time) {
				t.Errorf("the decision at %v is after its span's end %v", d.Time, span.EndTime)
			}
			if _, ok := eventAttr(d, "polyloop.decision.note"); ok {
				t.Error("the reviewer's note is in a span without IncludeContent")
			}
		})
	}
}

// TestADecisionsTextsAreCutAndContentOnlyWhenIncluded: who decided is on
// the decision event, cut to MaxDecisionText bytes at a UTF-8 boundary;
// the note, the call's and the edited arguments only with IncludeContent,
// cut likewise.
func TestADecisionsTextsAreCutAndContentOnlyWhenIncluded(t *testing.T) {
	by := strings.Repeat("é", 500)            // 1,000 bytes
	note := strings.Repeat("ünd so ", 15_000) // about 120 KB
	edited := `{"amount":30,"memo":"` + strings.Repeat("ß", 400) + `"}`
	for _, include := range []bool{false, true} {
		for _, verdict := range []events.Verdict{events.VerdictApproved, events.VerdictRejected} {
			ctx := context.Background()
			store := &seamstest.MemStore{}
			got := spans(t, otelsink.Options{IncludeContent: include, Runs: store}, func(sink *otelsink.Sink) {
				def, req := approvalAgent(store, sink, `TOOL refund {"amount":40}`, "FINAL: done")
				pending := awaitingCall(t, engine.Run, def, req)
				d := events.Decision{RunID: "traced", ResultID: pending.Call, Verdict: verdict, By: by, Note: note}
				if verdict == events.VerdictApproved {
					d.Arguments = &edited
				}
				if _, err := engine.Decide(ctx, store, d); err != nil {
					t.Fatal(err)
				}
				if _, err := engine.Resume(ctx, def, req); err != nil {
					t.Fatal(err)
				}
			})
			span := toolSpan(t, got, "execute_tool refund")
			if len(span.Events) != 2 {
				t.Fatalf("%d span events", len(span.Events))
			}
			cut := func(key, full string, e sdktrace.Event, want bool) {
				t.Helper()
				v, ok := eventAttr(e, key)
				switch {
				case ok != want:
					t.Errorf("include=%t %s: %s present=%t", include, verdict, key, ok)
				case !ok:
				case len(v.AsString()) > otelsink.MaxDecisionText || !utf8.ValidString(v.AsString()):
					t.Errorf("%s is %d bytes (valid UTF-8: %t), more than %d", key, len(v.AsString()), utf8.ValidString(v.AsString()), otelsink.MaxDecisionText)
				case len(full) > otelsink.MaxDecisionText && (!strings.HasSuffix(v.AsString(), "…") ||
					!strings.HasPrefix(full, strings.TrimSuffix(v.AsString(), "…"))):
					t.Errorf("%s = %q is not the start of the text, marked cut", key, v.AsString())
				case len(full) <= otelsink.MaxDecisionText && v.AsString() != full:
					t.Errorf("%s = %q, want %q", key, v.AsString(), full)
				}
			}
			awaiting, decision := span.Events[0], span.Events[1]
			cut("gen_ai.tool.call.arguments", `{"amount":40}`, awaiting, include)
			cut("polyloop.decision.by", by, decision, true)
			cut("polyloop.decision.note", note, decision, include)
			cut("polyloop.decision.arguments", edited, decision, include && verdict == events.VerdictApproved)
		}
	}
}

// TestTheWaitForAResolutionIsOnTheToolSpan: a never action a crash left
// in doubt, with Request.AwaitResolution, waits for an operator: the
// resumed process's sink puts the awaiting (resolution) and the finding
// (executed, with the observation under IncludeContent) on the action's
// span.
func TestTheWaitForAResolutionIsOnTheToolSpan(t *testing.T) {
	ctx := context.Background()
	store := &seamstest.MemStore{}
	o := otelsink.Options{IncludeContent: true, Runs: store}
	spans(t, o, func(sink *otelsink.Sink) {
		def, req := approvalAgent(&proptest.CrashingStore{Inner: store, After: 2}, sink, `TOOL pay {"amount":5}`, "FINAL: paid")
		req.AwaitResolution = true
		if _, err := engine.Run(ctx, def, req); !errors.Is(err, proptest.ErrCrashed) {
			t.Fatalf("crash: %v", err)
		}
	})
	got := spans(t, o, func(sink *otelsink.Sink) {
		def, req := approvalAgent(store, sink, `TOOL pay {"amount":5}`, "FINAL: paid")
		req.AwaitResolution = true
		pending := awaitingCall(t, engine.Resume, def, req)
		if pending.Awaits != events.AwaitsResolution {
			t.Fatalf("pending %+v", pending)
		}
		seen := "payment p-5 is in the ledger"
		if _, err := engine.Resolve(ctx, store, events.Decision{RunID: "traced", ResultID: pending.Call, Verdict: events.VerdictExecuted,
			By: "ops", Observation: &seen}); err != nil {
			t.Fatal(err)
		}
		if r, err := engine.Resume(ctx, def, req); err != nil || r.StopReason != events.StopAgentFinished {
			t.Fatalf("resume: %v %v", r.StopReason, err)
		}
	})
	span := toolSpan(t, got, "execute_tool pay")
	if len(span.Events) != 2 {
		t.Fatalf("%d span events: %+v", len(span.Events), span.Events)
	}
	if v, _ := eventAttr(span.Events[0], "polyloop.awaits"); span.Events[0].Name != "polyloop.awaiting" || v.AsString() != "resolution" {
		t.Errorf("first event %q awaits %q", span.Events[0].Name, v.AsString())
	}
	d := span.Events[1]
	if v, _ := eventAttr(d, "polyloop.decision.verdict"); d.Name != "polyloop.decision" || v.AsString() != "executed" {
		t.Errorf("second event %q verdict %q", d.Name, v.AsString())
	}
	if v, _ := eventAttr(d, "polyloop.decision.observation"); v.AsString() != "payment p-5 is in the ledger" {
		t.Errorf("observation %q", v.AsString())
	}
}
