package report_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/report"
	"github.com/polyloop/polyloop/seams"
)

// TestDecidableIsTheCallAPersonMayDecideNow: one row per rule. A run
// nobody drives offers the call it awaits a person for, or the action its
// log leaves in doubt (as a call awaiting a resolution); a run a driver
// holds, one between steps, a model call in doubt (no person resolves
// one), a finished and a corrupt run offer none.
func TestDecidableIsTheCallAPersonMayDecideNow(t *testing.T) {
	now := time.Now()
	nobody := seams.RunInfo{RunID: "r", Status: seams.StatusInterrupted}
	held := seams.RunInfo{RunID: "r", Status: seams.StatusRunning, Owner: "w1", LeaseExpires: now.Add(time.Hour)}
	sound := proptest.SoundStream("r")
	resolution := sound[3].(events.Intent)
	resolution.Awaits = events.AwaitsResolution
	approval := awaitsApproval("r")
	for _, c := range []struct {
		name   string
		info   seams.RunInfo
		stream []events.Event
		want   *recovery.PendingCall // Since aside
	}{
		{"nobody drives it, an action awaits approval: that call", nobody, append(sound[:3:3], approval),
			&recovery.PendingCall{Call: "r0a", Awaits: events.AwaitsApproval, Tool: "refund", Arguments: `{"amount":250}`,
				ArgumentsSchema: approval.ArgumentsSchema, ReplayPolicy: events.ReplayNever}},
		{"nobody drives it, an action awaits a finding: that call", nobody, append(sound[:4:4], resolution),
			&recovery.PendingCall{Call: "r0a", Awaits: events.AwaitsResolution, Tool: "list", ReplayPolicy: events.ReplayNever}},
		{"nobody drives it, an action in doubt: the action, to be resolved", nobody, sound[:4],
			&recovery.PendingCall{Call: "r0a", Awaits: events.AwaitsResolution, Tool: "list", ReplayPolicy: events.ReplayNever}},
		{"held, an action in doubt in its tail: none (a call in progress)", held, sound[:4], nil},
		{"held, an action awaiting approval in its tail: none", held, append(sound[:3:3], approval), nil},
		{"nobody drives it, a model call in doubt: none", nobody, sound[:2], nil},
		{"nobody drives it, between steps: none", nobody, sound[:5], nil},
		{"finished: none", nobody, sound, nil},
		{"corrupt: none", nobody, append(sound[:1:1], sound[2:4]...), nil},
	} {
		r := report.Classify(c.info, envelopes(c.stream), nil)
		got := r.Decidable()
		if got != nil {
			g := *got
			g.Since = time.Time{}
			got = &g
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s (status %s): %+v, want %+v", c.name, r.Status, got, c.want)
		}
	}
}
