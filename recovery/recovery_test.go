package recovery_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
)

func stamp(evs []events.Event) []events.Envelope {
	var ids events.IDSource
	t0 := time.UnixMilli(1_760_000_000_000)
	out := make([]events.Envelope, len(evs))
	for i, ev := range evs {
		out[i] = events.Envelope{ID: ids.Next(t0.Add(time.Duration(i) * time.Millisecond)), Kind: ev.Kind(), SchemaVersion: events.CurrentSchemaVersion, Event: ev}
	}
	return out
}

// prefix is the first n events of the sound sample stream: step 0 is a
// model call (safe), a reply, an action intent (never) and its completion.
func prefix(n int) []events.Envelope { return stamp(proptest.SoundStream("r")[:n]) }

func classify(t *testing.T, stream []events.Envelope) recovery.Verdict {
	t.Helper()
	v, err := recovery.Classify("r", stream)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestRowNotStarted(t *testing.T) {
	v := classify(t, prefix(1))
	if v.State != recovery.BetweenSteps || v.Step != 0 || v.Plan != recovery.PlanNextStep || v.InDoubt != nil {
		t.Fatalf("%+v", v)
	}
}

func TestRowModelCallUnknown(t *testing.T) {
	v := classify(t, prefix(2))
	if v.State != recovery.ModelCallUnknown || v.InDoubt == nil || v.InDoubt.ResultID != "r0m" || v.Plan != recovery.PlanCallAgain {
		t.Fatalf("safe policy: %+v", v)
	}
	never := proptest.SoundStream("r")[:2]
	in := never[1].(events.Intent)
	in.ReplayPolicy = events.ReplayNever
	never[1] = in
	if v := classify(t, stamp(never)); v.Plan != recovery.PlanStopUnknown {
		t.Fatalf("never policy: %+v", v)
	}
}

func TestRowKnownFailure(t *testing.T) {
	evs := append(proptest.SoundStream("r")[:1], proptest.FailedModelCall("r", 0)[:2]...)
	v := classify(t, stamp(evs))
	if v.State != recovery.KnownFailure || v.Plan != recovery.PlanCompleteError || v.InDoubt != nil {
		t.Fatalf("%+v", v)
	}
}

func TestRowReplyStored(t *testing.T) {
	v := classify(t, prefix(3))
	if v.State != recovery.ReplyStored || v.Plan != recovery.PlanReparse || v.InDoubt != nil {
		t.Fatalf("%+v", v)
	}
}

func TestRowActionUnknown(t *testing.T) {
	v := classify(t, prefix(4))
	if v.State != recovery.ActionUnknown || v.InDoubt == nil || v.InDoubt.ToolName != "list" || v.Plan != recovery.PlanStopUnknown {
		t.Fatalf("never policy: %+v", v)
	}
	safe := proptest.SoundStream("r")[:4]
	in := safe[3].(events.Intent)
	in.ReplayPolicy = events.ReplaySafe
	safe[3] = in
	if v := classify(t, stamp(safe)); v.Plan != recovery.PlanExecuteAgain {
		t.Fatalf("safe policy: %+v", v)
	}
}

func TestRowStepDone(t *testing.T) {
	for _, n := range []int{5, 8, 11} { // after an action step, a rejected call, a parse failure
		v := classify(t, prefix(n))
		if v.State != recovery.BetweenSteps || v.Plan != recovery.PlanNextStep {
			t.Fatalf("prefix %d: %+v", n, v)
		}
	}
	if v := classify(t, prefix(5)); v.Step != 1 {
		t.Fatalf("next step %d, want 1", v.Step)
	}
}

func TestFinishedRunCarriesItsResult(t *testing.T) {
	v := classify(t, stamp(proptest.SoundStream("r")))
	if v.State != recovery.Finished || v.Plan != recovery.PlanReturnResult || v.Result == nil || len(v.Result.Steps) != 4 {
		t.Fatalf("%+v", v)
	}
}

func TestEveryPrefixOfASoundLogIsSound(t *testing.T) {
	all := proptest.SoundStream("r")
	for n := 1; n <= len(all); n++ {
		if err := recovery.Check("r", prefix(n)); err != nil {
			t.Fatalf("prefix %d: %v", n, err)
		}
	}
}

// TestCorruptionIsRefusedWithEveryReason: each structural rule, broken on
// its own, is named; several broken at once are all listed.
func TestCorruptionIsRefusedWithEveryReason(t *testing.T) {
	s := proptest.SoundStream("r")
	v := events.CurrentSchemaVersion
	cat := func(parts ...[]events.Event) []events.Event {
		var out []events.Event
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	one := func(evs ...events.Event) []events.Event { return evs }
	cases := []struct {
		name   string
		stream []events.Event
		reason string
	}{
		{"no run_started", s[1:5], "the first event is not run_started"},
		{"two run_started", cat(s[:5], s[:1]), "a second run_started"},
		{"two run_finished", cat(s, s[len(s)-1:]), "follows run_finished"},
		{"event after run_finished", cat(s, s[1:2]), "follows run_finished"},
		{"steps not contiguous", cat(s[:5], s[8:11]), "not contiguous"},
		{"two model intents for one step", cat(s[:2], s[1:2]), "a second model intent for step 0"},
		{"two action intents for one step", cat(s[:4], s[3:4]), "a second action intent"},
		{"action intent without model intent", cat(s[:1], s[3:4]), "without a model intent"},
		{"intent ahead of an unfinished step", cat(s[:3], s[5:6]), "ahead of unfinished step 0"},
		{"model result without intent", cat(s[:1], s[2:3]), "without a model intent"},
		{"model result for another intent", cat(s[:2], s[6:7]), "does not match"},
		{"step result without action intent", cat(s[:3], s[4:5]), "without an action intent"},
		{"action intent but step has no result id", cat(s[:4], one(events.StepCompleted{RunID: "r",
			Step: events.StepRecord{StepIdx: 0, SchemaVersion: v}})), "has no result_id"},
		{"action intent closed without an outcome", cat(s[:4], one(events.StepCompleted{RunID: "r", ResultID: "r0a",
			Step: events.StepRecord{StepIdx: 0, SchemaVersion: v}})), "without an outcome"},
		{"step completed before its model result", cat(s[:2], one(events.StepCompleted{RunID: "r",
			Step: events.StepRecord{StepIdx: 0, SchemaVersion: v}})), "without a model result"},
		{"event of another run", cat(s[:1], proptest.SoundStream("other")[1:2]), "belongs to run"},
		{"finished mid-step without cause", cat(s[:3], one(events.RunFinished{RunID: "r",
			Result: events.RunResult{RunID: "r", StopReason: events.StopAgentFinished, SchemaVersion: v}})), "with step 0 unfinished"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := recovery.Check("r", stamp(c.stream))
			var ce *recovery.CorruptError
			if !errors.As(err, &ce) || !errors.Is(err, recovery.ErrCorrupt) {
				t.Fatalf("got %v, want a *CorruptError", err)
			}
			if !strings.Contains(err.Error(), c.reason) {
				t.Fatalf("reasons %q do not say %q", ce.Reasons, c.reason)
			}
		})
	}
	t.Run("keys out of order", func(t *testing.T) {
		stream := prefix(5)
		stream[2].ID, stream[3].ID = stream[3].ID, stream[2].ID
		if err := recovery.Check("r", stream); err == nil || !strings.Contains(err.Error(), "key is not after") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("two events under one key", func(t *testing.T) {
		stream := prefix(5)
		stream[3].ID = stream[2].ID
		if err := recovery.Check("r", stream); err == nil || !strings.Contains(err.Error(), "key is not after") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("every reason is listed", func(t *testing.T) {
		err := recovery.Check("r", stamp(cat(s[1:2], s[:1], s[2:3], s[2:3])))
		var ce *recovery.CorruptError
		if !errors.As(err, &ce) || len(ce.Reasons) < 3 {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("cancelled with a side effect in flight is sound", func(t *testing.T) {
		evs := cat(s[:4], one(events.RunFinished{RunID: "r", Result: events.RunResult{RunID: "r", StopReason: events.StopCancelled, SchemaVersion: v}}))
		if err := recovery.Check("r", stamp(evs)); err != nil {
			t.Fatal(err)
		}
	})
}

// TestEachStateHasARunStatus: a tail state is a finer run status, never a
// second vocabulary for it: finished, in_doubt where the table has a side
// effect in doubt, running everywhere else.
func TestEachStateHasARunStatus(t *testing.T) {
	for _, c := range []struct {
		state recovery.State
		want  seams.RunStatus
	}{
		{recovery.Empty, seams.StatusRunning},
		{recovery.BetweenSteps, seams.StatusRunning},
		{recovery.ModelCallUnknown, seams.StatusInDoubt},
		{recovery.KnownFailure, seams.StatusRunning},
		{recovery.ReplyStored, seams.StatusRunning},
		{recovery.ActionUnknown, seams.StatusInDoubt},
		{recovery.Finished, seams.StatusFinished},
	} {
		if got := c.state.Status(); got != c.want {
			t.Errorf("%s: status %s, want %s", c.state, got, c.want)
		}
	}
}

// TestPlanForIsTheTable: each state's plan; a side effect in doubt is
// replayed only under the policy safe — an empty or unknown policy is
// planned as never (stop with resume_state_unknown), the fail-safe default.
func TestPlanForIsTheTable(t *testing.T) {
	cases := []struct {
		state  recovery.State
		policy events.ReplayPolicy
		want   recovery.Plan
	}{
		{recovery.BetweenSteps, "", recovery.PlanNextStep},
		{recovery.ModelCallUnknown, events.ReplaySafe, recovery.PlanCallAgain},
		{recovery.ModelCallUnknown, events.ReplayNever, recovery.PlanStopUnknown},
		{recovery.KnownFailure, events.ReplaySafe, recovery.PlanCompleteError},
		{recovery.ReplyStored, events.ReplayNever, recovery.PlanReparse},
		{recovery.ActionUnknown, events.ReplaySafe, recovery.PlanExecuteAgain},
		{recovery.ActionUnknown, events.ReplayNever, recovery.PlanStopUnknown},
		{recovery.ModelCallUnknown, "", recovery.PlanStopUnknown},
		{recovery.ModelCallUnknown, "sometimes", recovery.PlanStopUnknown},
		{recovery.ActionUnknown, "", recovery.PlanStopUnknown},
		{recovery.ActionUnknown, "SAFE", recovery.PlanStopUnknown},
		{recovery.Finished, "", recovery.PlanReturnResult},
	}
	for _, c := range cases {
		if got := recovery.PlanFor(c.state, c.policy); got != c.want {
			t.Errorf("PlanFor(%s, %s) = %q, want %q", c.state, c.policy, got, c.want)
		}
	}
}

// TestDamageIsACorruptionReason: what a store could not decode is listed
// in the *CorruptError beside the structural problems of what it could; a
// store failure stays a store failure. Both are corruption
// (events.ErrCorruption), as every layer's damage is.
func TestDamageIsACorruptionReason(t *testing.T) {
	stream := prefix(5)
	damage := &events.DamageError{RunID: "r", Problems: []error{
		&events.DecodeError{ID: stream[2].ID, Err: events.ErrChecksum, Detail: "stored 1, computed 2"},
	}}
	loaded := append(stream[:2:2], stream[3:]...) // the damaged value is missing
	_, err := recovery.ClassifyLoaded("r", loaded, fmt.Errorf("kv: load run: %w", damage))
	var ce *recovery.CorruptError
	if !errors.As(err, &ce) {
		t.Fatalf("got %v, want a *CorruptError", err)
	}
	if len(ce.Reasons) < 2 || !strings.Contains(ce.Reasons[0], "checksum mismatch") || !strings.Contains(err.Error(), "without a model reply") {
		t.Fatalf("reasons %q do not list the damage and the gap it left", ce.Reasons)
	}
	if !errors.Is(err, recovery.ErrCorrupt) || !errors.Is(err, events.ErrCorruption) {
		t.Fatalf("%v matches recovery.ErrCorrupt %t, events.ErrCorruption %t; want both", err,
			errors.Is(err, recovery.ErrCorrupt), errors.Is(err, events.ErrCorruption))
	}
	if err := recovery.Check("r", loaded); !errors.Is(err, recovery.ErrCorrupt) || !errors.Is(err, events.ErrCorruption) {
		t.Fatalf("a log breaking a structural rule: %v, want it to match recovery.ErrCorrupt and events.ErrCorruption", err)
	}
	failure := errors.New("disk unplugged")
	if _, err := recovery.ClassifyLoaded("r", nil, failure); err != failure {
		t.Fatalf("a store failure came back as %v", err)
	}
	if v, err := recovery.ClassifyLoaded("r", stream, nil); err != nil || v.State != recovery.BetweenSteps {
		t.Fatalf("a sound load: %+v, %v", v, err)
	}
}
