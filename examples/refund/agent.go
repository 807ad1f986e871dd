package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// ticket is the customer's request the run handles.
const ticket = "Ticket 7731 from Dana Reyes: order A-1042 arrived broken. Please refund it."

// orders is the shop's order book.
var orders = map[string]string{
	"A-1042": "order A-1042: 250.00 EUR, a ceramic lamp, delivered 2026-11-28; the customer reports it arrived broken",
	"A-1043": "order A-1043: 40.00 EUR, two mugs, delivered 2026-11-29",
}

// provider is the payment provider: each refund it makes is a line of its
// ledger (a JSON Lines file) naming the call that asked for it. Every
// call pays: a provider with no idempotency key, so that a refund made
// twice would show.
type provider struct {
	path  string
	delay time.Duration // how long it takes to confirm a refund it made
}

// refund is one line of the ledger.
type refund struct {
	Call   string  `json:"call"` // the engine's result id of the tool call
	Run    string  `json:"run"`
	Order  string  `json:"order"`
	Amount float64 `json:"amount"`
}

// pay makes the refund r: the line is on disk before pay returns, and the
// confirmation comes delay later.
func (p *provider) pay(ctx context.Context, r refund) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(p.path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	select {
	case <-time.After(p.delay):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// tools are the clerk's: lookup_order reads (safe to repeat after a
// crash); refund pays (never repeated).
func tools(p *provider) (*seams.Registry, error) {
	order := map[string]any{"type": "string", "pattern": "^A-[0-9]{4}$"}
	return seams.NewRegistry(
		seams.Tool{
			Spec: seams.ToolSpec{Name: "lookup_order", Description: "Look an order up.", ReplayPolicy: events.ReplaySafe,
				Parameters: map[string]any{"type": "object", "required": []string{"order"}, "additionalProperties": false,
					"properties": map[string]any{"order": order}}},
			Handler: func(_ context.Context, a map[string]any) (string, error) {
				if o, ok := orders[a["order"].(string)]; ok {
					return o, nil
				}
				return "", fmt.Errorf("no order %s", a["order"])
			},
		},
		seams.Tool{
			Spec: seams.ToolSpec{Name: "refund", Description: "Refund an amount of an order to the customer.",
				Parameters: map[string]any{"type": "object", "required": []string{"order", "amount"}, "additionalProperties": false,
					"properties": map[string]any{"order": order,
						"amount": map[string]any{"type": "number", "exclusiveMinimum": 0, "maximum": 1000}}}},
			Handler: func(ctx context.Context, a map[string]any) (string, error) {
				call, _ := seams.CallOf(ctx)
				r := refund{Call: call.ResultID, Run: call.RunID, Order: a["order"].(string), Amount: a["amount"].(float64)}
				if err := p.pay(ctx, r); err != nil {
					return "", seams.EnvFailure(err) // the provider is down: not the model's problem
				}
				return fmt.Sprintf("refunded %.2f EUR for order %s (provider reference %s)", r.Amount, r.Order, r.Call), nil
			},
		},
	)
}

// refundsOver is the approval policy: a refund of more than limit waits
// for a person's approval.
type refundsOver struct{ limit float64 }

// RequiresApproval implements seams.ApprovalPolicy.
func (p refundsOver) RequiresApproval(a seams.Action) bool {
	if a.ToolCall == nil || a.ToolCall.Name != "refund" {
		return false
	}
	amount, _ := a.ToolCall.Arguments["amount"].(float64)
	return amount > p.limit
}

// Parameters implements seams.ApprovalPolicy.
func (p refundsOver) Parameters() map[string]string {
	return map[string]string{"refunds_over": fmt.Sprint(p.limit)}
}

// clerk is the offline model: it looks the order up, asks for the
// refund, then answers the customer from what it was told last — the
// provider's confirmation, or the reviewer's rejection with its note. Its
// replies follow from the prompt alone, so a call replayed after a crash
// gets the reply the first got.
type clerk struct{}

// Call implements seams.ModelClient.
func (clerk) Call(_ context.Context, call seams.ModelCall) (events.ModelReply, error) {
	reply := func(s string) (events.ModelReply, error) {
		return events.ModelReply{CallID: fmt.Sprintf("clerk-%d", call.CallIndex), Content: s}, nil
	}
	switch call.CallIndex {
	case 0:
		return reply(`{"tool":"lookup_order","arguments":{"order":"A-1042"}}`)
	case 1:
		return reply(`The lamp cost 250.00 EUR. {"tool":"refund","arguments":{"order":"A-1042","amount":250}}`)
	}
	told := strings.TrimPrefix(lastText(call.Messages), "Tool result: ")
	answer := "Dear Dana, " + told + "."
	switch {
	case strings.Contains(told, "rejected by reviewer"):
		answer = "Dear Dana, I could not refund order A-1042 (" + told + ")."
	case strings.HasPrefix(told, "refunded"):
		answer = "Dear Dana, I " + told + "."
	}
	b, err := json.Marshal(map[string]string{"final": answer})
	if err != nil {
		return events.ModelReply{}, err
	}
	return reply(string(b))
}

// Parameters implements seams.ModelClient.
func (clerk) Parameters() map[string]string { return map[string]string{"kind": "scripted clerk"} }

// lastText is the text of the prompt's last message.
func lastText(msgs []seams.Message) string {
	if len(msgs) == 0 {
		return ""
	}
	var b strings.Builder
	for _, c := range msgs[len(msgs)-1].Content {
		if t, ok := c.(seams.TextBlock); ok {
			b.WriteString(t.Text)
		}
	}
	return b.String()
}
