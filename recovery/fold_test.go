package recovery_test

import (
	"testing"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
)

// TestTheFoldWalksTheRecoveryTable: folding a sound run event by event
// passes through the rows of the recovery table in order, with the intent
// in doubt and the plan each row calls for, and ends with the recorded
// result, its steps and usage put back. (The rows with a failure are
// Classify's tests'.)
func TestTheFoldWalksTheRecoveryTable(t *testing.T) {
	stream := proptest.SoundStream("run-1")
	want := []struct {
		state recovery.State
		plan  recovery.Plan
		doubt string // the result id of the intent in doubt
	}{
		{recovery.Empty, recovery.PlanNone, ""},
		{recovery.BetweenSteps, recovery.PlanNextStep, ""},         // run_started
		{recovery.ModelCallUnknown, recovery.PlanCallAgain, "r0m"}, // model intent, safe
		{recovery.ReplyStored, recovery.PlanReparse, ""},           // reply
		{recovery.ActionUnknown, recovery.PlanStopUnknown, "r0a"},  // action intent, never
		{recovery.BetweenSteps, recovery.PlanNextStep, ""},         // step 0 completed
	}
	var f recovery.Fold
	for i, w := range want {
		if i > 0 {
			f.Apply(stream[i-1])
		}
		doubt := ""
		if in := f.InDoubt(); in != nil {
			doubt = in.ResultID
		}
		if f.State() != w.state || f.Plan() != w.plan || doubt != w.doubt {
			t.Errorf("after %d events: %s, %s, in doubt %q; want %s, %s, %q", i, f.State(), f.Plan(), doubt, w.state, w.plan, w.doubt)
		}
	}
	if _, ok := f.Result(); ok {
		t.Fatal("a run in progress has a result")
	}
	for _, ev := range stream[len(want)-1:] {
		f.Apply(ev)
	}
	r, ok := f.Result()
	if !ok || f.State() != recovery.Finished || f.Plan() != recovery.PlanReturnResult {
		t.Fatalf("the whole stream: %s, %s, result %v", f.State(), f.Plan(), ok)
	}
	if len(r.Steps) != 4 || r.Steps[3].StepIdx != 3 || r.Usage == nil || r.StopReason != events.StopAgentFinished || f.Events != len(stream) {
		t.Fatalf("the result: %d steps, usage %v, %s; %d events folded of %d", len(r.Steps), r.Usage, r.StopReason, f.Events, len(stream))
	}
	if v, err := recovery.Classify("run-1", stamp(stream)); err != nil || v.Result.StopReason != r.StopReason || len(v.Steps()) != len(r.Steps) {
		t.Fatalf("Classify of the same stream: %v", err)
	}
}
