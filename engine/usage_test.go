package engine_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// costly is n action replies, each reporting in input and out output
// tokens, then a final answer.
func costly(n int, in, out int64) []seamstest.Turn {
	var turns []seamstest.Turn
	for i := range n {
		u := &events.Usage{InputTokens: &in, OutputTokens: &out}
		turns = append(turns, seamstest.Turn{Reply: events.ModelReply{CallID: fmt.Sprint("c", i), Content: "ACTION: work", Usage: u}})
	}
	return append(turns, seamstest.Turn{Reply: events.ModelReply{Content: "FINAL: done"}})
}

// TestTheTokenBudget: the budget is checked before each model call
// against the durable total; the call that crosses it completes (the
// documented overshoot), the next is not made.
func TestTheTokenBudget(t *testing.T) {
	cases := []struct {
		name   string
		budget int64
		want   events.StopReason
		calls  int
	}{
		{"no budget: the run ends on its answer", 0, events.StopAgentFinished, 6},
		{"reached exactly: no further call", 120, events.StopTokenBudget, 3},
		{"crossed by a call: that call counts, none after", 100, events.StopTokenBudget, 3},
		{"never reached", 1_000_000, events.StopAgentFinished, 6},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := newAgent(openKV(t), "tok", costly(5, 30, 10)...)
			a.req.Budget.MaxTotalTokens = c.budget
			r, err := engine.Run(context.Background(), a.def, a.req)
			if err != nil {
				t.Fatal(err)
			}
			if r.StopReason != c.want || len(a.model.Calls()) != c.calls {
				t.Fatalf("%s after %d calls, want %s after %d", r.StopReason, len(a.model.Calls()), c.want, c.calls)
			}
			replies := min(c.calls, 5)
			want := events.UsageTotals{InputTokens: 30 * int64(replies), OutputTokens: 10 * int64(replies), Calls: c.calls,
				CallsWithoutUsage: c.calls - replies}
			if r.Usage == nil || *r.Usage != want {
				t.Fatalf("usage %+v, want %+v", r.Usage, want)
			}
		})
	}
}

// TestTheTokenBudgetCountsWhatIsDurable: a run crashed and resumed stops
// at the same total, counting the replies the crashed process stored.
func TestTheTokenBudgetCountsWhatIsDurable(t *testing.T) {
	store := openKV(t)
	a := newAgent(&proptest.CrashingStore{Inner: store, After: 3}, "tok", costly(5, 30, 10)...) // crashes in step 1, its model call in doubt
	a.req.Budget.MaxTotalTokens = 100
	if _, err := engine.Run(context.Background(), a.def, a.req); !errors.Is(err, proptest.ErrCrashed) {
		t.Fatal(err)
	}
	// The budget is in the parameter snapshot: another budget is another run.
	c := newAgent(store, "tok", costly(5, 30, 10)...)
	c.req.Budget.MaxTotalTokens = 200
	if _, err := engine.Resume(context.Background(), c.def, c.req); !errors.Is(err, engine.ErrParametersChanged) {
		t.Fatalf("resume with another token budget: %v", err)
	}
	b := newAgent(store, "tok", costly(5, 30, 10)...)
	b.req.Budget.MaxTotalTokens = 100
	r, err := engine.Resume(context.Background(), b.def, b.req)
	if err != nil {
		t.Fatal(err)
	}
	if r.StopReason != events.StopTokenBudget || r.Usage.Total() != 120 || len(r.Steps) != 3 {
		t.Fatalf("resumed to %s, %d tokens, %d steps", r.StopReason, r.Usage.Total(), len(r.Steps))
	}
}

// TestANegativeTokenBudgetIsInvalid names the field.
func TestANegativeTokenBudgetIsInvalid(t *testing.T) {
	a := newAgent(openKV(t), "neg", costly(1, 1, 1)...)
	a.req.Budget.MaxTotalTokens = -5
	if _, err := engine.Run(context.Background(), a.def, a.req); !errors.Is(err, engine.ErrInvalidRequest) {
		t.Fatalf("got %v", err)
	}
}
