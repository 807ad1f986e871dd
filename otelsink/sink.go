// Package otelsink is a seams.EventSink that turns a run's durable events
// into OpenTelemetry spans following the GenAI semantic conventions:
//
//   - one "invoke_agent {agent}" span per run (gen_ai.operation.name,
//     gen_ai.agent.name, gen_ai.conversation.id = the run id, and the stop
//     reason as polyloop.stop_reason), ended when the run finishes;
//   - a "chat {model}" span per model call (gen_ai.request.model from the
//     run's model binding, gen_ai.response.id = the provider's call id,
//     gen_ai.usage.input_tokens and gen_ai.usage.output_tokens when
//     reported, error.type on a failed call; the model is the binding's
//     "model" key, binding.model in the parameter snapshot);
//   - an "execute_tool {tool}" span per action (gen_ai.tool.name,
//     gen_ai.tool.call.id = the action's result id, polyloop.action.status;
//     error.type when the environment failed or the call was rejected).
//
// An action that waited for a person (schema 1.5) shows the wait on its
// execute_tool span, which runs from its result id's minting to its
// step's completion and so holds the wait: a "polyloop.awaiting" span
// event at each awaiting intent (polyloop.awaits = approval or
// resolution, gen_ai.tool.name, gen_ai.tool.call.id, and with
// Options.IncludeContent the call's arguments awaiting the decision), and a
// "polyloop.decision" event at each decision (polyloop.decision.verdict,
// polyloop.decision.by, gen_ai.tool.call.id, and
// polyloop.decision.waited_ms, from the awaiting intent to the decision,
// when the sink knows both). A decision is written by engine.Decide or
// engine.Resolve, not by a driver, so the sink learns of it when the
// caller emits the envelope they return to it, or else, with
// Options.Runs, reads it from the log when the step completes (an
// awaiting intent with no decision seen) or when a process's sink first
// sees a run another process drove (the decisions of the step in
// progress then). The reviewer's note, edited arguments and an
// operator's observation go into the event only with
// Options.IncludeContent, and every text a person gave is cut to
// MaxDecisionText bytes.
//
// Spans are built from the durable events, not from the calls as they
// happen: a span starts when its side effect's result id was minted (the
// id is a ULID, so it carries that time) and ends at its result's durable
// time. The run's span starts at the run's first event and is started when
// the sink sees the first event a driver wrote of the run. The engine
// hands Emit the values of the context engine.Run or engine.Resume was
// given: when that context carries a span (a service's request span), the
// run's span is its child, in its trace.
//
// A model call or action a resumed run made again — its intent durable
// before a crash, its result not — has a span marked polyloop.replayed
// that starts when the resume made it again, not before the downtime: the
// engine says so in Emit's context (seams.Replay). The log does not, so
// only the process that made the replay knows.
//
// A crash loses the spans its process's span processor had not exported
// yet (the SDK's batch processor holds them for seconds). So a sink that
// first sees a run it did not see start — a resume in this process after
// another sink, or in another process — reads the run's log
// (Options.Runs) and exports the spans of the events written before the
// resume before those it makes: the resuming process's trace holds every
// span of the run, and what the crashed process did export is exported
// twice.
//
// # Ids: New and NewWithProvider
//
// New builds the sink's own provider, whose trace and span ids derive
// from the run id and the result ids. A run driven without a caller's span
// is, in every process that drives it, the trace derived from its run id;
// a span exported again has the trace id, span id, parent, times and
// attributes of the copy a crashed process may have exported (but for a
// replayed call, which the later process knows only as the log shows it,
// from its intent). OTLP allows such a duplicate — its delivery is at
// least once, a client resending what was not acknowledged — and backends
// that dedupe spans by id or content keep one (Tempo does when it reads a
// trace and when it compacts, Jaeger drops a span whose content repeats).
// A run driven under a caller's span is in the caller's trace, its span
// ids derived as well; resumed by a process that did not see it start,
// under another caller's span (or none), it is in that caller's trace (or
// its own) from then on, that trace holding every span of the run, and the
// spans the crashed process exported stay in the first trace, under a run
// span that never ended there.
//
// NewWithProvider starts spans with a service's provider, which chooses
// the ids: a run is one trace per process that drives it, under the span of
// the context it is driven in or a root of its own. The run's span is
// open from the sink's first sight of the run to its end, its children
// point at it, and the trace of the process that finishes the run holds
// every span of the run (with Options.Runs); a crashed process's exported spans stay in its
// own trace, under a run span that was never exported, and are not
// duplicates of the later ones for any backend (other ids).
//
// Prompts are not in the log and never in spans; replies, tool arguments
// and observations go into spans only with Options.IncludeContent. The sink
// never blocks the run: Emit puts the event on a bounded queue and returns;
// when the queue is full the event is dropped, Emit returns ErrDropped (the
// engine counts it in RunResult.EventDeliveryFailures) and Dropped counts
// it. Shutdown drains the queue and flushes New's exporter (or the
// provider).
//
// The gen_ai.* attribute keys are this package's own constants (the semconv
// package dropped them). What does not live here: the exporter (OTLP or
// any sdktrace.SpanExporter the consumer chooses), the provider, and the
// engine, which this package knows only through seams.EventSink and the
// context it passes Emit.
package otelsink

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// GenAI semantic-convention keys and values used here.
const (
	keyOperationName   = attribute.Key("gen_ai.operation.name")
	keyAgentName       = attribute.Key("gen_ai.agent.name")
	keyConversationID  = attribute.Key("gen_ai.conversation.id")
	keyRequestModel    = attribute.Key("gen_ai.request.model")
	keyResponseID      = attribute.Key("gen_ai.response.id")
	keyInputTokens     = attribute.Key("gen_ai.usage.input_tokens")
	keyOutputTokens    = attribute.Key("gen_ai.usage.output_tokens")
	keyToolName        = attribute.Key("gen_ai.tool.name")
	keyToolCallID      = attribute.Key("gen_ai.tool.call.id")
	keyToolArguments   = attribute.Key("gen_ai.tool.call.arguments")
	keyToolResult      = attribute.Key("gen_ai.tool.call.result")
	keyErrorType       = attribute.Key("error.type")
	keyStopReason      = attribute.Key("polyloop.stop_reason")
	keyActionStatus    = attribute.Key("polyloop.action.status")
	keyReplyContent    = attribute.Key("polyloop.reply.content")
	keyCachedTokens    = attribute.Key("polyloop.usage.cached_input_tokens")
	keyReasoningTokens = attribute.Key("polyloop.usage.reasoning_tokens")
	keyAwaits          = attribute.Key("polyloop.awaits")
	keyVerdict         = attribute.Key("polyloop.decision.verdict")
	keyDecidedBy       = attribute.Key("polyloop.decision.by")
	keyWaitedMs        = attribute.Key("polyloop.decision.waited_ms")
	keyDecisionNote    = attribute.Key("polyloop.decision.note")
	keyEditedArguments = attribute.Key("polyloop.decision.arguments")
	keyFoundObserved   = attribute.Key("polyloop.decision.observation")
	keyReplayed        = attribute.Key("polyloop.replayed")

	eventAwaiting = "polyloop.awaiting"
	eventDecision = "polyloop.decision"

	opInvokeAgent = "invoke_agent"
	opChat        = "chat"
	opExecuteTool = "execute_tool"
)

// ErrDropped: the queue was full and the event was not traced.
var ErrDropped = errors.New("otelsink: queue full, event dropped")

// MaxDecisionText bounds, in bytes, each text a person gave that a span
// event carries (who decided; with IncludeContent the note, edited
// arguments and observation): a longer one is cut at a UTF-8 boundary and
// ends with "…".
const MaxDecisionText = 256

// Options configure New.
type Options struct {
	// AgentName is gen_ai.agent.name and part of the run span's name
	// (default "polyloop").
	AgentName string
	// IncludeContent puts replies, tool arguments and observations into
	// spans. Off by default: they may hold personal or secret data.
	IncludeContent bool
	// QueueSize bounds the events waiting to be turned into spans (default
	// 1024).
	QueueSize int
	// Resource describes the service (default: the SDK's default
	// resource). New only: with NewWithProvider the provider's resource
	// does.
	Resource *resource.Resource
	// Runs, when set, lets a process that resumes a run it did not see
	// start read the run's log: the run's start time for its invoke_agent
	// span, and the events written before the resume, whose spans it
	// exports (a crashed process may not have). Without it such a span
	// starts at the earliest event this process saw of the run, and the
	// spans of the steps before the resume are only those the other
	// process exported.
	Runs seams.RunReader
	// RunsTimeout bounds each read of Runs (zero: DefaultRunsTimeout). The
	// sink reads on its one goroutine, so a store that does not answer
	// would otherwise hold every later event in the queue, and drop those
	// that do not fit; a read that times out is a read that failed — the
	// spans it would have added are missing, the rest are exported.
	RunsTimeout time.Duration
}

// DefaultRunsTimeout is Options.RunsTimeout's default.
const DefaultRunsTimeout = 5 * time.Second

// load reads runID's log from Options.Runs within Options.RunsTimeout.
func (s *Sink) load(runID string) ([]events.Envelope, error) {
	wait := s.o.RunsTimeout
	if wait <= 0 {
		wait = DefaultRunsTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	return s.o.Runs.Load(ctx, runID)
}

// Sink is the EventSink. Use one per process; it serves every run.
type Sink struct {
	o Options
	// tp is New's own provider, nil under NewWithProvider; flusher is
	// the provider's ForceFlush when it has one.
	tp      *sdktrace.TracerProvider
	flusher interface{ ForceFlush(context.Context) error }
	derived bool // ids derive from the run and result ids (New)
	tracer  trace.Tracer
	queue   chan item
	done    chan struct{}
	dropped atomic.Int64
	// mu guards closed against the close of queue: Emit and ForceFlush
	// send under the read lock, Shutdown closes under the write lock.
	mu     sync.RWMutex
	closed bool

	// runs is what the worker knows of each run in progress.
	runs map[string]*runState
}

// item is a queued event with what Emit's context said of it — the
// caller's span, a replay — or (flushed set) a marker ForceFlush waits
// for.
type item struct {
	env     events.Envelope
	caller  trace.SpanContext
	replay  *seams.Replay
	flushed chan struct{}
}

// runState is a run as the worker has seen it.
type runState struct {
	start time.Time // the run's first event seen here (or loaded)
	model string    // the binding's model, for chat spans
	// span is the run's invoke_agent span, started at the first event a
	// driver wrote that the worker saw (not a decision, which a caller
	// emits), under the span in that event's context if it had one, and
	// ended when the run finishes.
	span trace.Span
	// waits are, by result id, the awaiting intents and decisions seen of
	// actions whose step has not completed, in the order written.
	waits map[string][]mark
}

// mark is an awaiting intent or a decision on an action, with its key.
type mark struct {
	id       ulid.ULID
	intent   *events.Intent
	decision *events.Decision
}

// note keeps env when it is an awaiting action intent or a decision, once
// (a decision may arrive both emitted and read from the log).
func (st *runState) note(env events.Envelope) {
	var m mark
	switch ev := env.Event.(type) {
	case events.Intent:
		if ev.IntentKind != events.IntentAction || ev.Awaits == "" {
			return
		}
		m = mark{id: env.ID, intent: &ev}
	case events.Decision:
		m = mark{id: env.ID, decision: &ev}
	default:
		return
	}
	rid := m.resultID()
	for _, have := range st.waits[rid] {
		if have.id == m.id {
			return
		}
	}
	if st.waits == nil {
		st.waits = map[string][]mark{}
	}
	st.waits[rid] = append(st.waits[rid], m)
	slices.SortFunc(st.waits[rid], func(a, b mark) int { return a.id.Compare(b.id) })
}

func (m mark) resultID() string {
	if m.intent != nil {
		return m.intent.ResultID
	}
	return m.decision.ResultID
}

// undecided reports whether marks hold an awaiting intent no decision
// seen answers.
func undecided(marks []mark) bool {
	n := 0
	for _, m := range marks {
		if m.intent != nil {
			n++
		} else {
			n--
		}
	}
	return n > 0
}

const tracerName = "github.com/polyloop/polyloop/otelsink"

// New returns a sink exporting spans with exporter (through a batching
// processor), their trace and span ids derived from the run and result
// ids.
func New(exporter sdktrace.SpanExporter, o Options) *Sink {
	opts := []sdktrace.TracerProviderOption{
		sdktrace.WithIDGenerator(derivedIDs{}),
		sdktrace.WithBatcher(exporter),
		sdktrace.WithSampler(sdktrace.AlwaysSample()),
	}
	if o.Resource != nil {
		opts = append(opts, sdktrace.WithResource(o.Resource))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	s := newSink(tp.Tracer(tracerName), o)
	s.tp, s.flusher, s.derived = tp, tp, true
	go s.work()
	return s
}

// NewWithProvider returns a sink starting its spans with tp's tracer —
// the service's provider, with its resource, sampler, processors and
// exporters; the provider chooses the spans' ids. Shutdown leaves tp to
// its owner. It refuses a nil tp, and Options.Resource, which the
// provider's resource replaces.
func NewWithProvider(tp trace.TracerProvider, o Options) (*Sink, error) {
	switch {
	case tp == nil:
		return nil, errors.New("otelsink: NewWithProvider: the tracer provider is nil")
	case o.Resource != nil:
		return nil, errors.New("otelsink: NewWithProvider: Options.Resource is set; with a provider, the provider's resource describes the service")
	}
	s := newSink(tp.Tracer(tracerName), o)
	s.flusher, _ = tp.(interface{ ForceFlush(context.Context) error })
	go s.work()
	return s, nil
}

func newSink(tracer trace.Tracer, o Options) *Sink {
	if o.AgentName == "" {
		o.AgentName = "polyloop"
	}
	if o.QueueSize <= 0 {
		o.QueueSize = 1024
	}
	return &Sink{o: o, tracer: tracer, queue: make(chan item, o.QueueSize), done: make(chan struct{}), runs: map[string]*runState{}}
}

// Emit implements seams.EventSink: it queues env, with the span ctx
// carries (the parent of a run's span) and the replay it reports, and
// returns at once.
func (s *Sink) Emit(ctx context.Context, env events.Envelope) error {
	it := item{env: env, caller: trace.SpanContextFromContext(ctx)}
	if r, ok := seams.ReplayOf(ctx); ok {
		it.replay = &r
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		s.dropped.Add(1)
		return ErrDropped
	}
	select {
	case s.queue <- it:
		return nil
	default:
		s.dropped.Add(1)
		return ErrDropped
	}
}

// Parameters implements seams.EventSink: tracing does not change how a run
// behaves, so a run traced or not resumes either way.
func (s *Sink) Parameters() map[string]string { return nil }

// Dropped is the number of events dropped: the queue was full, or the
// sink was shut down.
func (s *Sink) Dropped() int64 { return s.dropped.Load() }

// ForceFlush turns every event queued so far into spans and exports them.
// Unlike Emit it waits (for the queue, then the exporter or the
// provider's ForceFlush), up to ctx.
func (s *Sink) ForceFlush(ctx context.Context) error {
	done := make(chan struct{})
	s.mu.RLock()
	if s.closed { // shut down: nothing is queued any more
		s.mu.RUnlock()
		return s.flush(ctx)
	}
	select {
	case s.queue <- item{flushed: done}:
		s.mu.RUnlock()
	case <-ctx.Done():
		s.mu.RUnlock()
		return ctx.Err()
	}
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.flush(ctx)
}

func (s *Sink) flush(ctx context.Context) error {
	if s.flusher == nil {
		return nil
	}
	return s.flusher.ForceFlush(ctx)
}

// Shutdown stops accepting events, turns the queued ones into spans, and
// flushes and shuts down New's exporter; under NewWithProvider it flushes
// the provider, which its owner shuts down. The span of a run not
// finished stays open, unexported.
func (s *Sink) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.queue)
	}
	s.mu.Unlock()
	select {
	case <-s.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if s.tp == nil {
		return s.flush(ctx)
	}
	return s.tp.Shutdown(ctx)
}

func (s *Sink) work() {
	defer close(s.done)
	for it := range s.queue {
		if it.flushed != nil {
			close(it.flushed)
			continue
		}
		s.handle(it)
	}
}

// handle turns one event into what it ends: a chat span (a model result),
// an execute_tool span (a completed step with an action or a rejected tool
// call), the invoke_agent span (the run's end).
func (s *Sink) handle(it item) {
	env := it.env
	runID := events.RunIDOf(env.Event)
	st := s.runs[runID]
	if st == nil {
		st = &runState{start: env.Time()}
		s.runs[runID] = st
	}
	if _, decision := env.Event.(events.Decision); st.span == nil && !decision {
		s.begin(runID, st, it)
	}
	s.apply(runID, st, it)
}

// begin starts the run's span at the first event a driver wrote that this
// sink sees. A run it did not see start (resumed here) is read from
// Options.Runs: its start time and model, and the events before env,
// whose spans are exported again — the process that wrote them may have
// died before its exporter sent them.
func (s *Sink) begin(runID string, st *runState, it item) {
	env := it.env
	var past []events.Envelope
	if _, fresh := env.Event.(events.RunStarted); !fresh && s.o.Runs != nil {
		if stream, err := s.load(runID); err == nil && len(stream) > 0 {
			if t := stream[0].Time(); t.Before(st.start) {
				st.start = t
			}
			for _, e := range stream {
				if e.ID.Compare(env.ID) >= 0 {
					break
				}
				past = append(past, e)
			}
		}
	}
	ctx := context.WithValue(context.Background(), wantKey{}, want{trace: traceID(runID), span: spanID(runID, "")})
	if it.caller.IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, it.caller)
	}
	_, st.span = s.tracer.Start(ctx, opInvokeAgent+" "+s.o.AgentName, trace.WithTimestamp(st.start),
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(keyOperationName.String(opInvokeAgent),
			keyAgentName.String(s.o.AgentName), keyConversationID.String(runID)))
	for _, e := range past {
		s.apply(runID, st, item{env: e})
	}
}

// apply turns an event of the run into the span it ends, if any.
func (s *Sink) apply(runID string, st *runState, it item) {
	env := it.env
	switch ev := env.Event.(type) {
	case events.RunStarted:
		st.model = ev.ParameterSnapshot["binding.model"]
	case events.Intent, events.Decision:
		st.note(env)
	case events.ModelCallResult:
		s.chatSpan(runID, st, it, ev)
	case events.StepCompleted:
		s.toolSpan(runID, st, it, ev)
	case events.RunFinished:
		s.runSpan(st, env, ev)
		delete(s.runs, runID)
	}
}

// child starts a span under the run's span, its id (under New) derived
// from the run and key, at start — or, for the call a resumed run made
// again (it.replay names it), at the replay, marked replayed.
func (s *Sink) child(runID string, st *runState, it item, key, name string, start time.Time, attrs ...attribute.KeyValue) trace.Span {
	ctx := trace.ContextWithSpanContext(context.Background(), st.span.SpanContext())
	ctx = context.WithValue(ctx, wantKey{}, want{trace: st.span.SpanContext().TraceID(), span: spanID(runID, key)})
	kind := trace.SpanKindInternal // execute_tool: the tool runs in this process
	if strings.HasPrefix(name, opChat) {
		kind = trace.SpanKindClient // a call to the model's provider
	}
	if r := it.replay; r != nil && r.ResultID == key {
		start = r.At
		if end := it.env.Time(); start.After(end) { // the end is a ULID's, in whole milliseconds
			start = end
		}
		attrs = append(attrs, keyReplayed.Bool(true))
	}
	_, span := s.tracer.Start(ctx, name, trace.WithTimestamp(start), trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
	return span
}

// startOf is when a side effect began: its result id's ULID time (minted
// just before its intent was written), or fallback.
func startOf(resultID string, fallback time.Time) time.Time {
	if id, err := ulid.ParseStrict(resultID); err == nil {
		if t := ulid.Time(id.Time()); !t.After(fallback) {
			return t
		}
	}
	return fallback
}

func (s *Sink) chatSpan(runID string, st *runState, it item, ev events.ModelCallResult) {
	env := it.env
	name := opChat
	attrs := []attribute.KeyValue{keyOperationName.String(opChat), keyConversationID.String(runID)}
	if st.model != "" {
		name += " " + st.model
		attrs = append(attrs, keyRequestModel.String(st.model))
	}
	span := s.child(runID, st, it, ev.ResultID, name, startOf(ev.ResultID, env.Time()), attrs...)
	if r := ev.Reply; r != nil {
		if r.CallID != "" {
			span.SetAttributes(keyResponseID.String(r.CallID))
		}
		if u := r.Usage; u != nil {
			for _, c := range []struct {
				k attribute.Key
				v *int64
			}{{keyInputTokens, u.InputTokens}, {keyOutputTokens, u.OutputTokens}, {keyCachedTokens, u.CachedInputTokens}, {keyReasoningTokens, u.ReasoningTokens}} {
				if c.v != nil {
					span.SetAttributes(c.k.Int64(*c.v))
				}
			}
		}
		if s.o.IncludeContent {
			span.SetAttributes(keyReplyContent.String(r.Content))
		}
	} else {
		span.SetAttributes(keyErrorType.String("model_call_failed"))
		span.SetStatus(codes.Error, "the model call failed")
	}
	span.End(trace.WithTimestamp(env.Time()))
}

func (s *Sink) toolSpan(runID string, st *runState, it item, ev events.StepCompleted) {
	env := it.env
	rec := ev.Step
	if rec.Action == nil || ev.ActionOutcome == nil {
		return // no action: a final answer, a parse failure, a failed model call
	}
	name, attrs := opExecuteTool, []attribute.KeyValue{keyOperationName.String(opExecuteTool), keyConversationID.String(runID),
		keyActionStatus.String(string(ev.ActionOutcome.Status))}
	if rec.ToolName != nil {
		name += " " + *rec.ToolName
		attrs = append(attrs, keyToolName.String(*rec.ToolName))
	}
	// An executed action has its intent's result id; a tool call rejected
	// before execution has none (and no intent), so its span is keyed by
	// its step and lasts no time.
	key, start := fmt.Sprintf("step %d rejected", rec.StepIdx), env.Time()
	if ev.ResultID != "" {
		key, start = ev.ResultID, startOf(ev.ResultID, env.Time())
		attrs = append(attrs, keyToolCallID.String(ev.ResultID))
	}
	span := s.child(runID, st, it, key, name, start, attrs...)
	if ev.ResultID != "" {
		s.waitEvents(runID, st, ev.ResultID, span)
	}
	switch ev.ActionOutcome.Status {
	case events.StatusNotExecuted:
		span.SetAttributes(keyErrorType.String("tool_call_rejected"))
		span.SetStatus(codes.Error, "the tool call was rejected")
	case events.StatusEnvError:
		span.SetAttributes(keyErrorType.String("env_error"))
		span.SetStatus(codes.Error, "the environment failed")
	}
	if s.o.IncludeContent {
		if rec.ToolArguments != nil {
			span.SetAttributes(keyToolArguments.String(*rec.ToolArguments))
		}
		span.SetAttributes(keyToolResult.String(rec.Observation))
	}
	span.End(trace.WithTimestamp(env.Time()))
}

// waitEvents puts on span the wait of the action resultID for a person:
// an event per awaiting intent and per decision, at the time each was
// written. An awaiting intent whose decision the sink has not seen is
// looked up in the run's log when Options.Runs is set.
func (s *Sink) waitEvents(runID string, st *runState, resultID string, span trace.Span) {
	marks := st.waits[resultID]
	delete(st.waits, resultID)
	if undecided(marks) && s.o.Runs != nil {
		if stream, err := s.load(runID); err == nil {
			found := &runState{waits: map[string][]mark{resultID: marks}}
			for _, e := range stream {
				if d, ok := e.Event.(events.Decision); ok && d.ResultID == resultID {
					found.note(e)
				}
			}
			marks = found.waits[resultID]
		}
	}
	var awaited time.Time // the latest awaiting intent's time
	for _, m := range marks {
		at := ulid.Time(m.id.Time())
		if in := m.intent; in != nil {
			awaited = at
			attrs := []attribute.KeyValue{keyAwaits.String(string(in.Awaits)), keyToolCallID.String(in.ResultID)}
			if in.ToolName != "" {
				attrs = append(attrs, keyToolName.String(in.ToolName))
			}
			if s.o.IncludeContent && in.Arguments != "" {
				attrs = append(attrs, keyToolArguments.String(clip(in.Arguments)))
			}
			span.AddEvent(eventAwaiting, trace.WithTimestamp(at), trace.WithAttributes(attrs...))
			continue
		}
		d := m.decision
		attrs := []attribute.KeyValue{keyVerdict.String(string(d.Verdict)), keyDecidedBy.String(clip(d.By)), keyToolCallID.String(d.ResultID)}
		if !awaited.IsZero() && !at.Before(awaited) {
			attrs = append(attrs, keyWaitedMs.Int64(at.Sub(awaited).Milliseconds()))
		}
		if s.o.IncludeContent {
			if d.Note != "" {
				attrs = append(attrs, keyDecisionNote.String(clip(d.Note)))
			}
			if d.Arguments != nil {
				attrs = append(attrs, keyEditedArguments.String(clip(*d.Arguments)))
			}
			if d.Observation != nil {
				attrs = append(attrs, keyFoundObserved.String(clip(*d.Observation)))
			}
		}
		span.AddEvent(eventDecision, trace.WithTimestamp(at), trace.WithAttributes(attrs...))
	}
}

// clip cuts a text a person gave to MaxDecisionText bytes.
func clip(s string) string {
	if len(s) <= MaxDecisionText {
		return s
	}
	return events.Clip(s, MaxDecisionText-len("…")) + "…"
}

// runSpan ends the run's span at its end.
func (s *Sink) runSpan(st *runState, env events.Envelope, ev events.RunFinished) {
	span := st.span
	span.SetAttributes(keyStopReason.String(string(ev.Result.StopReason)))
	switch ev.Result.StopReason {
	case events.StopEnvError, events.StopLLMError, events.StopResumeStateUnknown:
		span.SetAttributes(keyErrorType.String(string(ev.Result.StopReason)))
		span.SetStatus(codes.Error, string(ev.Result.StopReason))
	}
	span.End(trace.WithTimestamp(env.Time()))
}

// Deterministic ids.

// traceID is the run's trace: the same in every process that drives it.
func traceID(runID string) trace.TraceID {
	h := sha256.Sum256([]byte("polyloop trace\x00" + runID))
	var id trace.TraceID
	copy(id[:], h[:])
	if !id.IsValid() {
		id[0] = 1
	}
	return id
}

// spanID is the span of a side effect (by result id) or, for "", of the run.
func spanID(runID, resultID string) trace.SpanID {
	h := sha256.Sum256([]byte(fmt.Sprintf("polyloop span\x00%d:%s\x00%s", len(runID), runID, resultID)))
	var id trace.SpanID
	copy(id[:], h[:])
	if !id.IsValid() {
		id[0] = 1
	}
	return id
}

// want carries the ids a span must get; derivedIDs hands them to the SDK.
type (
	wantKey struct{}
	want    struct {
		trace trace.TraceID
		span  trace.SpanID
	}
	derivedIDs struct{}
)

func (derivedIDs) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	w, _ := ctx.Value(wantKey{}).(want)
	return w.trace, w.span
}

func (derivedIDs) NewSpanID(ctx context.Context, _ trace.TraceID) trace.SpanID {
	w, _ := ctx.Value(wantKey{}).(want)
	return w.span
}
