package recovery_test

import (
	"fmt"
	"testing"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/recovery"
)

// streamFrom turns bytes into an event sequence: each pair (op, arg)
// appends one record whose kind, step index, result id and policy come from
// the bytes. It reaches sound logs, torn tails and every kind of damage.
func streamFrom(b []byte) []events.Event {
	v := events.CurrentSchemaVersion
	var out []events.Event
	for i := 0; i+1 < len(b); i += 2 {
		op, arg := b[i], b[i+1]
		step := int(arg % 6)
		policy := events.ReplaySafe
		if arg&0x40 != 0 {
			policy = events.ReplayNever
		}
		switch op % 7 {
		case 0:
			out = append(out, events.RunStarted{RunID: "f", SchemaVersion: v})
		case 1:
			out = append(out, events.Intent{RunID: "f", IntentKind: events.IntentModelCall, CallIndex: step, ResultID: fmt.Sprint("m", step), ReplayPolicy: policy})
		case 2:
			reply := &events.ModelReply{Content: "x"}
			var failure *string
			if arg&0x80 != 0 {
				s := "down"
				reply, failure = nil, &s
			}
			out = append(out, events.ModelCallResult{RunID: "f", ResultID: fmt.Sprint("m", step), Reply: reply, Failure: failure})
		case 3:
			out = append(out, events.Intent{RunID: "f", IntentKind: events.IntentAction, CallIndex: step, ResultID: fmt.Sprint("a", step), ReplayPolicy: policy})
		case 4:
			sc := events.StepCompleted{RunID: "f", Step: events.StepRecord{StepIdx: step, ParseOK: arg&0x80 != 0, SchemaVersion: v}}
			if arg&0x40 != 0 {
				sc.ResultID = fmt.Sprint("a", step)
				sc.ActionOutcome = &events.ActionOutcome{Status: events.StatusExecuted}
			}
			out = append(out, sc)
		case 5:
			out = append(out, events.RunFinished{RunID: "f", Result: events.RunResult{RunID: "f",
				StopReason: events.StopReasons[int(arg)%len(events.StopReasons)], SchemaVersion: v}})
		case 6:
			out = append(out, events.Intent{RunID: "g", IntentKind: events.IntentModelCall, CallIndex: step, ResultID: "z", ReplayPolicy: policy})
		}
	}
	return out
}

// FuzzClassify: recovery over arbitrary event sequences never panics, a
// refusal is always a *CorruptError with reasons, and a sound verdict is
// consistent with its plan.
func FuzzClassify(f *testing.F) {
	f.Add([]byte{0, 0, 1, 0, 2, 0, 3, 0, 4, 0x40, 1, 1, 2, 1, 4, 0x81, 5, 6})
	f.Add([]byte{0, 0, 1, 0x40, 2, 0x80})
	f.Add([]byte{1, 0, 0, 0, 4, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		stream := stamp(streamFrom(b))
		v, err := recovery.Classify("f", stream)
		if err != nil {
			ce, ok := err.(*recovery.CorruptError)
			if !ok || len(ce.Reasons) == 0 {
				t.Fatalf("refusal without reasons: %v", err)
			}
			return
		}
		if len(stream) > 0 && v.Plan == recovery.PlanNone {
			t.Fatalf("sound log without a plan: %+v", v)
		}
		if (v.State == recovery.ModelCallUnknown || v.State == recovery.ActionUnknown) != (v.InDoubt != nil) {
			t.Fatalf("state %s with in-doubt %v", v.State, v.InDoubt)
		}
		// Every prefix of a sound log is sound: that is what a crash leaves.
		// (At most 64 prefixes, evenly spaced, to keep an input linear.)
		stride := max(1, len(stream)/64)
		for n := 0; n < len(stream); n += stride {
			if err := recovery.Check("f", stream[:n]); err != nil {
				t.Fatalf("prefix %d of a sound log is refused: %v", n, err)
			}
		}
	})
}
