package seamstest

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/scripted"
	"github.com/polyloop/polyloop/seams"
)

// Model, Turn and Replies are package scripted's, under the names tests
// have always used.
type (
	Model = scripted.Model
	Turn  = scripted.Turn
)

// Replies is scripted.Replies.
func Replies(contents ...string) []Turn { return scripted.Replies(contents...) }

// Parser is a small deterministic seams.DecisionParser over one-line
// decisions:
//
//	FINAL: <answer>            a final answer
//	TOOL <name> <json object>  a tool call
//	ACTION: <text>             a tool-less action
//
// Anything else is an InvalidDecision. HistoryText is the reply's content.
type Parser struct{}

// Parse implements seams.DecisionParser.
func (Parser) Parse(r events.ModelReply) seams.ParsedReply {
	text := strings.TrimSpace(r.Content)
	out := seams.ParsedReply{HistoryText: r.Content}
	switch {
	case strings.HasPrefix(text, "FINAL:"):
		out.Decision = seams.FinalAnswer{Text: strings.TrimSpace(strings.TrimPrefix(text, "FINAL:"))}
	case strings.HasPrefix(text, "ACTION:"):
		out.Decision = seams.Action{Text: strings.TrimSpace(strings.TrimPrefix(text, "ACTION:"))}
	case strings.HasPrefix(text, "TOOL "):
		name, args, _ := strings.Cut(strings.TrimPrefix(text, "TOOL "), " ")
		var m map[string]any
		if strings.TrimSpace(args) == "" {
			args = "{}"
		}
		if err := json.Unmarshal([]byte(args), &m); err != nil {
			out.Decision = seams.InvalidDecision{Explanation: "tool arguments are not a JSON object: " + err.Error()}
			return out
		}
		out.Decision = seams.Action{Text: text, ToolCall: &seams.ToolCall{Name: name, Arguments: m}}
	default:
		out.Decision = seams.InvalidDecision{Explanation: "expected FINAL:, ACTION: or TOOL <name> <json>"}
	}
	return out
}

// Parameters implements seams.DecisionParser.
func (Parser) Parameters() map[string]string { return map[string]string{"kind": "line"} }

// Executor is a scripted seams.ActionExecutor that counts executions per
// result id. Respond decides each outcome; nil means executed with the
// observation "ok: <action text>". A Respond that panics tests panic
// handling. Safe for concurrent use.
type Executor struct {
	Respond func(ctx context.Context, call seams.ActionCall) (events.ActionOutcome, error)

	mu    sync.Mutex
	count map[string]int
	calls []seams.ActionCall
}

// Execute implements seams.ActionExecutor.
func (e *Executor) Execute(ctx context.Context, call seams.ActionCall) (events.ActionOutcome, error) {
	e.mu.Lock()
	if e.count == nil {
		e.count = map[string]int{}
	}
	e.count[call.ResultID]++
	e.calls = append(e.calls, call)
	e.mu.Unlock()
	if e.Respond != nil {
		return e.Respond(ctx, call)
	}
	return events.ActionOutcome{Status: events.StatusExecuted, Observation: "ok: " + call.Action.Text}, nil
}

// Executions returns how often the action with resultID was executed.
func (e *Executor) Executions(resultID string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.count[resultID]
}

// Calls returns every call received, in order.
func (e *Executor) Calls() []seams.ActionCall {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]seams.ActionCall(nil), e.calls...)
}

// Parameters implements seams.ActionExecutor.
func (e *Executor) Parameters() map[string]string { return map[string]string{"kind": "scripted"} }

// Sink records every envelope it receives. Err makes every Emit fail with
// it; Panic makes every Emit panic. Safe for concurrent use.
type Sink struct {
	Err   error
	Panic bool

	mu   sync.Mutex
	envs []events.Envelope
}

// Emit implements seams.EventSink.
func (s *Sink) Emit(_ context.Context, e events.Envelope) error {
	s.mu.Lock()
	s.envs = append(s.envs, e)
	s.mu.Unlock()
	if s.Panic {
		panic("seamstest: sink told to panic")
	}
	return s.Err
}

// Envelopes returns what was received, in order.
func (s *Sink) Envelopes() []events.Envelope {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]events.Envelope(nil), s.envs...)
}

// Parameters implements seams.EventSink.
func (s *Sink) Parameters() map[string]string { return map[string]string{"kind": "recording"} }

// Gate holds the At-th call through it (counting from 1) until Release is
// closed, closing Entered when that call arrives: a test acts while a run
// waits in a model call or an action. Make it with NewGate.
type Gate struct {
	At       int32
	Entered  chan struct{}
	Release  chan struct{}
	received atomic.Int32
}

// NewGate holds the at-th call.
func NewGate(at int32) *Gate {
	return &Gate{At: at, Entered: make(chan struct{}), Release: make(chan struct{})}
}

// pass lets a call through, holding the At-th until Release or ctx ends.
func (g *Gate) pass(ctx context.Context) error {
	if g.received.Add(1) != g.At {
		return nil
	}
	close(g.Entered)
	select {
	case <-g.Release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// PausingModel is a model whose calls go through a Gate.
type PausingModel struct {
	seams.ModelClient
	*Gate
}

// NewPausingModel wraps inner, holding its at-th call.
func NewPausingModel(inner seams.ModelClient, at int32) *PausingModel {
	return &PausingModel{ModelClient: inner, Gate: NewGate(at)}
}

// Call implements seams.ModelClient.
func (m *PausingModel) Call(ctx context.Context, call seams.ModelCall) (events.ModelReply, error) {
	if err := m.pass(ctx); err != nil {
		return events.ModelReply{}, err
	}
	return m.ModelClient.Call(ctx, call)
}

// PausingExecutor is an executor whose actions go through a Gate.
type PausingExecutor struct {
	seams.ActionExecutor
	*Gate
}

// Execute implements seams.ActionExecutor.
func (e *PausingExecutor) Execute(ctx context.Context, call seams.ActionCall) (events.ActionOutcome, error) {
	if err := e.pass(ctx); err != nil {
		return events.ActionOutcome{}, err
	}
	return e.ActionExecutor.Execute(ctx, call)
}
