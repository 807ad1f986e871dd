// Package scripted is a seams.ModelClient that plays replies written in
// advance: a model for offline runs — the demo, the examples, a consumer's
// agent tried without an endpoint — and for tests (seams/seamstest.Model is
// this Model). The call with CallIndex i gets the script's i-th turn, so a
// call the engine replays after a crash gets the reply the original got,
// as a durable run needs.
//
// What does not live here: a client for a real endpoint (package openai)
// and the other test doubles (seams/seamstest).
package scripted

import (
	"context"
	"fmt"
	"sync"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// Turn is the model's scripted behaviour for one call index.
type Turn struct {
	Reply events.ModelReply
	Err   error
	// Block makes the call wait for its context to end, then fail with the
	// context's error: a model that hangs until cancelled.
	Block bool
}

// Model is a scripted seams.ModelClient: the call with CallIndex i gets
// Turns[i], so a replayed call gets the reply the original would have got.
// A call past the script fails. Safe for concurrent use.
type Model struct {
	Turns []Turn
	// OnCall, when set, runs at the start of every call (to cancel a context
	// mid-run, say).
	OnCall func(seams.ModelCall)

	mu    sync.Mutex
	calls []seams.ModelCall
}

var _ seams.ModelClient = (*Model)(nil)

// Call implements seams.ModelClient.
func (m *Model) Call(ctx context.Context, call seams.ModelCall) (events.ModelReply, error) {
	m.mu.Lock()
	m.calls = append(m.calls, call)
	m.mu.Unlock()
	if m.OnCall != nil {
		m.OnCall(call)
	}
	if call.CallIndex >= len(m.Turns) {
		return events.ModelReply{}, fmt.Errorf("scripted: no turn for call %d (the script has %d)", call.CallIndex, len(m.Turns))
	}
	t := m.Turns[call.CallIndex]
	if t.Block {
		<-ctx.Done()
		return events.ModelReply{}, ctx.Err()
	}
	if err := ctx.Err(); err != nil {
		return events.ModelReply{}, err
	}
	return t.Reply, t.Err
}

// Calls returns every call received, in order.
func (m *Model) Calls() []seams.ModelCall {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]seams.ModelCall(nil), m.calls...)
}

// Parameters implements seams.ModelClient.
func (m *Model) Parameters() map[string]string { return map[string]string{"kind": "scripted"} }

// Replies is a script of successful replies with the given contents, the
// i-th with call id "call-i".
func Replies(contents ...string) []Turn {
	out := make([]Turn, len(contents))
	for i, c := range contents {
		out[i] = Turn{Reply: events.ModelReply{CallID: fmt.Sprintf("call-%d", i), Content: c}}
	}
	return out
}
