package seams

import (
	"context"
	"strings"
	"time"

	"github.com/polyloop/polyloop/events"
)

// ModelReply is what a ModelClient returns: events.ModelReply, which lives
// in package events because the log stores it; the name here lets
// "go doc seams ModelReply" find it.
type ModelReply = events.ModelReply

// ModelClient calls a model. Implemented by consumers (an OpenAI-compatible
// client, a gateway, a scripted test double).
//
// Call must honour ctx and return an error for any failure; the engine
// records the error text as the model call's failure and stops the run with
// llm_error. Call may be retried by Resume with the same ResultID when the
// request's model replay policy is safe.
type ModelClient interface {
	Call(ctx context.Context, call ModelCall) (events.ModelReply, error)
	Parameters() map[string]string
}

// DecisionParser turns a model reply into a decision. It must be pure and
// deterministic: Resume re-parses a stored reply and must get the same
// decision. It never fails: unusable output is an InvalidDecision.
type DecisionParser interface {
	Parse(reply events.ModelReply) ParsedReply
	Parameters() map[string]string
}

// ActionExecutor performs an action. Implemented by consumers (a sandbox, an
// environment) or obtained from Registry.Executor.
//
// An error, or a panic, means the environment failed: the engine records an
// env_error outcome and stops. A failure the model should see and react to
// belongs in the outcome's observation with status executed. Execute may be
// called again with the same ResultID after a crash when the action's
// replay policy is safe.
type ActionExecutor interface {
	Execute(ctx context.Context, call ActionCall) (events.ActionOutcome, error)
	Parameters() map[string]string
}

// EventSink receives each event after it is durable, in order. Errors and
// panics are counted in RunResult.EventDeliveryFailures and never change the
// run. Emit should not block for long: it runs on the run's goroutine.
//
// The ctx of Emit carries the values of the context the run is driven
// under (Run's or Resume's: a caller's trace span, say) without its
// cancellation, and, once a resumed run makes again a model call or an
// action whose intent a crash left without its result, a Replay
// (ReplayOf).
type EventSink interface {
	Emit(ctx context.Context, e events.Envelope) error
	Parameters() map[string]string
}

// Replay is a model call or action a resumed run made again (its
// replay policy safe): the result id of its intent, written before the
// crash, and when the driver that resumed the run began it again. The log
// does not tell a replayed call's result from a result made once; the
// driver says so in the context it passes EventSink.Emit, from the
// replay on.
type Replay struct {
	ResultID string
	At       time.Time
}

type replayKey struct{}

// WithReplay returns ctx carrying r.
func WithReplay(ctx context.Context, r Replay) context.Context {
	return context.WithValue(ctx, replayKey{}, r)
}

// ReplayOf returns the Replay ctx carries, if any.
func ReplayOf(ctx context.Context) (Replay, bool) {
	r, ok := ctx.Value(replayKey{}).(Replay)
	return r, ok
}

// Role is a message's author.
type Role string

// The three roles. Observations are fed back as RoleUser messages.
const (
	RoleSystem    Role = "system"
	RoleUser      Role = "user"
	RoleAssistant Role = "assistant"
)

// Message is one prompt message.
type Message struct {
	Role    Role
	Content []ContentBlock
}

// Text returns a message holding one TextBlock.
func Text(role Role, text string) Message {
	return Message{Role: role, Content: []ContentBlock{TextBlock{Text: text}}}
}

// Text is the message's text: its text blocks joined in order, as a model
// client sends them (package openai does); blocks of other kinds are skipped.
func (m Message) Text() string {
	var b strings.Builder
	for _, c := range m.Content {
		if t, ok := c.(TextBlock); ok {
			b.WriteString(t.Text)
		}
	}
	return b.String()
}

// ContentBlock is a closed sum of message parts; TextBlock is its one member
// today, so other media can be added without breaking callers.
type ContentBlock interface{ contentBlock() }

// TextBlock is text content.
type TextBlock struct{ Text string }

func (TextBlock) contentBlock() {}

// ModelCall is what the engine asks of the model.
type ModelCall struct {
	// Messages is the prompt. It is shared with the engine and later calls:
	// read it, do not modify it (appending to it is safe: its capacity is
	// capped).
	Messages []Message
	// CallIndex counts model calls in the run from 0; it equals the step index.
	CallIndex int
	RunID     string
	// ResultID was allocated before the call and written in its intent; a
	// replay after a crash carries the same id.
	ResultID string
	// Binding is the request's ModelBinding, passed through untouched.
	Binding map[string]string
}

// ParsedReply is a parser's reading of a reply.
type ParsedReply struct {
	// HistoryText is what enters the history as the assistant's message and
	// the step's raw_output.
	HistoryText string
	Decision    Decision
}

// Decision is a closed sum: Action, FinalAnswer or InvalidDecision.
type Decision interface{ decision() }

// Action asks for something to be done: a tool call, or (ToolCall nil) a
// tool-less action whose Text the executor interprets (a code block).
type Action struct {
	Text     string
	ToolCall *ToolCall
}

// FinalAnswer ends the run with agent_finished.
type FinalAnswer struct{ Text string }

// InvalidDecision is unusable output; Explanation is fed back to the model.
type InvalidDecision struct{ Explanation string }

func (Action) decision()          {}
func (FinalAnswer) decision()     {}
func (InvalidDecision) decision() {}

// ToolCall names a registered tool and its arguments (a JSON object).
type ToolCall struct {
	Name      string
	Arguments map[string]any
}

// ActionCall is what the engine asks of an executor.
type ActionCall struct {
	Action  Action
	RunID   string
	StepIdx int
	// ResultID was allocated before execution and written in its intent; a
	// replay after a crash carries the same id.
	ResultID string
}
