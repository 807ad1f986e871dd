package report_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/projections"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/report"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// TestFilterRules: one row per rule of a listing filter.
func TestFilterRules(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	run := func(id string, status seams.RunStatus, reason events.StopReason, started time.Time) report.Run {
		return report.Run{Info: seams.RunInfo{RunID: id, StopReason: reason, FirstEvent: started}, Status: status}
	}
	runs := []report.Run{ // newest first, as List returns them
		run("d", seams.StatusCorrupt, "", t0.Add(3*time.Hour)),
		run("c", seams.StatusInDoubt, "", t0.Add(2*time.Hour)),
		run("b", seams.StatusFinished, events.StopTaskCompleted, t0.Add(time.Hour)),
		run("a", seams.StatusFinished, events.StopStepBudget, t0),
	}
	ids := func(rs []report.Run) string {
		var out []string
		for _, r := range rs {
			out = append(out, r.Info.RunID)
		}
		return strings.Join(out, ",")
	}
	cases := []struct {
		name string
		f    report.Filter
		want string
	}{
		{"the zero filter keeps all", report.Filter{}, "d,c,b,a"},
		{"any of several statuses", report.Filter{Status: []seams.RunStatus{seams.StatusInDoubt, seams.StatusCorrupt}}, "d,c"},
		{"a stop reason", report.Filter{StopReason: []string{"step_budget"}}, "a"},
		{"since is inclusive", report.Filter{Since: t0.Add(time.Hour)}, "d,c,b"},
		{"limit keeps the newest", report.Filter{Limit: 2}, "d,c"},
		{"limit counts kept runs only", report.Filter{Status: []seams.RunStatus{seams.StatusFinished}, Limit: 1}, "b"},
	}
	for _, c := range cases {
		if got := ids(c.f.Apply(runs)); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
	for _, bad := range []report.Filter{{Status: []seams.RunStatus{"done"}}, {StopReason: []string{"tired"}}, {Limit: -1}} {
		if bad.Check() == nil {
			t.Errorf("%+v passed Check", bad)
		}
	}
	if (report.Filter{}).Check() != nil { // limit 0: no limit
		t.Error("the zero filter failed Check")
	}
	if (report.Filter{Status: seams.RunStatuses, StopReason: []string{"token_budget"}, Limit: 3}).Check() != nil {
		t.Error("a valid filter failed Check")
	}
}

func TestParseSince(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{"24h": now.Add(-24 * time.Hour), "90m": now.Add(-90 * time.Minute),
		"2026-11-29T08:00:00Z": time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)} {
		if got, err := report.ParseSince(in, now); err != nil || !got.Equal(want) {
			t.Errorf("%s: %v %v", in, got, err)
		}
	}
	if _, err := report.ParseSince("yesterday", now); err == nil {
		t.Error("yesterday parsed")
	}
}

// TestListClassifiesNewestFirst: List reads every run through the reader,
// newest first, with the status recovery's verdict and the store's
// liveness give (nobody holds the unfinished run).
func TestListClassifiesNewestFirst(t *testing.T) {
	store := &seamstest.MemStore{}
	ctx := context.Background()
	sound := proptest.SoundStream("sound")
	proptest.AppendEach(t, store, "sound", sound)
	time.Sleep(2 * time.Millisecond)
	if _, err := store.Append(ctx, "started", ulid.ULID{}, events.RunStarted{RunID: "started", SchemaVersion: events.CurrentSchemaVersion}); err != nil {
		t.Fatal(err)
	}
	runs, err := report.List(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	got := []string{runs[0].Info.RunID + ":" + string(runs[0].Status), runs[1].Info.RunID + ":" + string(runs[1].Status)}
	if want := []string{"started:interrupted", "sound:finished"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("%v, want %v", got, want)
	}
	if j := runs[1].JSON(); j.StopReason == nil || j.Started == nil || j.Events != len(sound) || j.FinalAnswer == nil || *j.FinalAnswer != "42" {
		t.Fatalf("json %+v", j)
	}
}

// writingStore is a store an agent writes to between a listing's index
// read and its stream loads: each Runs returns the index as it was, then
// appends the next of the batches still to write.
type writingStore struct {
	*seamstest.MemStore
	t       *testing.T
	run     string
	batches [][]events.Event
}

func (s *writingStore) Runs(ctx context.Context) ([]seams.RunInfo, error) {
	infos, err := s.MemStore.Runs(ctx)
	if len(s.batches) > 0 {
		stream, lerr := s.MemStore.Load(ctx, s.run)
		if lerr != nil {
			s.t.Fatal(lerr)
		}
		if _, aerr := s.MemStore.Append(ctx, s.run, stream[len(stream)-1].ID, s.batches[0]...); aerr != nil {
			s.t.Fatal(aerr)
		}
		s.batches = s.batches[1:]
	}
	return infos, err
}

// TestAListingLineIsOneMomentOfItsRun: a run an agent writes to between
// the index read and the stream load is listed as one moment of it:
// every figure of its line (events, steps, stop reason, last event,
// status, usage, answer) is what the stream's first Events events say.
func TestAListingLineIsOneMomentOfItsRun(t *testing.T) {
	ctx := context.Background()
	stream := proptest.SoundStream("live")
	for i := range stream { // replies that report usage, so tokens count
		if r, ok := stream[i].(events.ModelCallResult); ok && r.Reply != nil {
			reply := *r.Reply
			reply.Usage = &events.Usage{InputTokens: ptr(int64(100 * (i + 1))), OutputTokens: ptr(int64(i + 1))}
			r.Reply = &reply
			stream[i] = r
		}
	}
	store := &writingStore{MemStore: &seamstest.MemStore{}, t: t, run: "live",
		batches: [][]events.Event{stream[5:8], stream[8:]}}
	proptest.AppendEach(t, store, "live", stream[:5])
	for round := range 3 {
		runs, err := report.List(ctx, store)
		if err != nil || len(runs) != 1 {
			t.Fatalf("round %d: %d runs, %v", round, len(runs), err)
		}
		got := runs[0].JSON()
		loaded, err := store.Load(ctx, "live")
		if err != nil || got.Events < 1 || got.Events > len(loaded) {
			t.Fatalf("round %d: the line counts %d events of %d (%v)", round, got.Events, len(loaded), err)
		}
		moment := loaded[:got.Events]
		want := report.Classify(projections.Summarize(moment), moment, nil).JSON()
		if !reflect.DeepEqual(got, want) {
			g, _ := json.Marshal(got)
			w, _ := json.Marshal(want)
			t.Errorf("round %d: the line mixes moments:\n got %s\nwant %s (its first %d events)", round, g, w, got.Events)
		}
	}
}

func envelopes(evs []events.Event) []events.Envelope {
	out := make([]events.Envelope, len(evs))
	for i, ev := range evs {
		out[i] = events.Envelope{ID: ulid.Make(), Kind: ev.Kind(), SchemaVersion: events.CurrentSchemaVersion, Event: ev}
	}
	return out
}

// TestVerdictJSON: the three verdicts, with what each carries.
func TestVerdictJSON(t *testing.T) {
	sound := proptest.SoundStream("r")
	verdict := func(evs []events.Event) report.VerdictJSON {
		stream := envelopes(evs)
		return report.Verdict(report.Classify(seams.RunInfo{RunID: "r"}, stream, nil), stream)
	}
	fin := verdict(sound)
	if fin.Verdict != "finished" || *fin.StopReason != events.StopAgentFinished || fin.FinalAnswer == nil || *fin.FinalAnswer != "42" ||
		*fin.Plan != recovery.PlanReturnResult || fin.InDoubt != nil || fin.Problems != nil {
		t.Errorf("finished: %+v", fin)
	}
	doubt := verdict(sound[:4]) // the never action's intent, no outcome
	if doubt.Verdict != "resumable" || *doubt.Step != 0 || *doubt.State != recovery.ActionUnknown || *doubt.Plan != recovery.PlanStopUnknown ||
		doubt.InDoubt == nil || *doubt.InDoubt.Tool != "list" || doubt.InDoubt.ReplayPolicy != events.ReplayNever || doubt.StopReason != nil {
		t.Errorf("in doubt: %+v", doubt)
	}
	between := verdict(sound[:5])
	if between.Verdict != "resumable" || between.InDoubt != nil || *between.Plan != recovery.PlanNextStep {
		t.Errorf("between steps: %+v", between)
	}
	if doubt.Pending != nil || between.Pending != nil || fin.Pending != nil {
		t.Errorf("a call pending in a run whose tail awaits nobody: %+v %+v %+v", doubt.Pending, between.Pending, fin.Pending)
	}
	bad := verdict(append(sound[:1:1], sound[2:]...)) // a model result without its intent
	if bad.Verdict != "corrupt" || len(bad.Problems) == 0 || bad.State != nil || bad.Plan != nil {
		t.Errorf("corrupt: %+v", bad)
	}
}

// TestAPendingCallIsInTheJSON: the verdict and the listing of a run
// awaiting a person carry the pending call — its id, step, what it
// awaits, tool, arguments and their schema, since when — and those of a
// run awaiting nobody carry null.
func TestAPendingCallIsInTheJSON(t *testing.T) {
	sound := proptest.SoundStream("r")
	awaiting := envelopes(append(sound[:3:3], awaitsApproval("r")))
	r := report.Classify(seams.RunInfo{RunID: "r"}, awaiting, nil)
	since := report.Stamp(awaiting[3].Time())
	want := `{"call":"r0a","step":0,"awaits":"approval","tool":"refund","arguments":"{\"amount\":250}",` +
		`"arguments_schema":"{\"type\":\"object\",\"properties\":{\"amount\":{\"type\":\"number\"}}}","replay_policy":"never","since":"` + since + `"}`
	for name, v := range map[string]any{"verdict": report.Verdict(r, awaiting), "listing": r.JSON()} {
		var fields map[string]json.RawMessage
		b, _ := json.Marshal(v)
		if err := json.Unmarshal(b, &fields); err != nil {
			t.Fatal(err)
		}
		if got := string(fields["pending"]); got != want {
			t.Errorf("%s: pending\n got %s\nwant %s", name, got, want)
		}
	}
	done := report.Classify(seams.RunInfo{RunID: "r"}, envelopes(sound), nil)
	b, _ := json.Marshal(done.JSON())
	if !strings.Contains(string(b), `"pending":null`) {
		t.Errorf("a finished run's listing: %s", b)
	}
}

// TestDecisionCommands: the polyloop-admin lines that decide a pending
// call — approve and reject, or resolve either way (an action awaiting a
// finding, or in doubt: Run.Decidable) — each word pasted into a shell as
// it is printed.
func TestDecisionCommands(t *testing.T) {
	approval := recovery.PendingCall{Call: "01CALL", Awaits: events.AwaitsApproval, Tool: "refund", ArgumentsSchema: `{"type":"object"}`}
	resolution := recovery.PendingCall{Call: "01CALL", Awaits: events.AwaitsResolution, Tool: "refund"}
	for _, c := range []struct {
		store, run string
		p          recovery.PendingCall
		want       string
	}{
		{"/tmp/s.db", "refund-1/a", approval,
			"approve: polyloop-admin approve /tmp/s.db refund-1/a 01CALL [--note TEXT] [--arguments JSON]\n" +
				"reject: polyloop-admin reject /tmp/s.db refund-1/a 01CALL [--note TEXT]\n"},
		{"/tmp/my runs.db", "it's", recovery.PendingCall{Call: "c", Awaits: events.AwaitsApproval},
			"approve: polyloop-admin approve '/tmp/my runs.db' 'it'\\''s' c [--note TEXT]\n" +
				"reject: polyloop-admin reject '/tmp/my runs.db' 'it'\\''s' c [--note TEXT]\n"},
		{"postgres://u:xxxxx@h/d?sslmode=disable&polyloop_schema=x", "$(rm -rf ~)", resolution,
			"it ran: polyloop-admin resolve 'postgres://u:xxxxx@h/d?sslmode=disable&polyloop_schema=x' '$(rm -rf ~)' 01CALL --executed --observation TEXT\n" +
				"it did not run: polyloop-admin resolve 'postgres://u:xxxxx@h/d?sslmode=disable&polyloop_schema=x' '$(rm -rf ~)' 01CALL --not-executed\n"},
	} {
		var got strings.Builder
		for _, cmd := range report.DecisionCommands(c.store, c.run, c.p) {
			got.WriteString(cmd.Says + ": " + cmd.Line + "\n")
		}
		if got.String() != c.want {
			t.Errorf("%s %s:\n got %s\nwant %s", c.store, c.run, got.String(), c.want)
		}
	}
}

// TestWriteDecisionCommands: each command on a line of its own, indented,
// the commands lined up after what they say.
func TestWriteDecisionCommands(t *testing.T) {
	for _, c := range []struct {
		awaits events.Awaits
		want   string
	}{
		{events.AwaitsApproval, "  approve: polyloop-admin approve s.db r c [--note TEXT]\n" +
			"  reject:  polyloop-admin reject s.db r c [--note TEXT]\n"},
		{events.AwaitsResolution, "  it ran:         polyloop-admin resolve s.db r c --executed --observation TEXT\n" +
			"  it did not run: polyloop-admin resolve s.db r c --not-executed\n"},
	} {
		var got strings.Builder
		report.WriteDecisionCommands(&got, "  ", report.DecisionCommands("s.db", "r", recovery.PendingCall{Call: "c", Awaits: c.awaits}))
		if got.String() != c.want {
			t.Errorf("%s:\n%s\nwant\n%s", c.awaits, got.String(), c.want)
		}
	}
}

// TestEnvErrorsAndStepTokens: the causes of env_error outcomes by step,
// and each step's model usage (nil where none was reported).
func TestEnvErrorsAndStepTokens(t *testing.T) {
	cause, in, out := "exec: python: not found", int64(10), int64(2)
	failed := events.ActionOutcome{Status: events.StatusEnvError, Observation: "x", EnvError: &cause}
	evs := []events.Event{
		events.RunStarted{RunID: "r", SchemaVersion: events.CurrentSchemaVersion},
		events.ModelCallResult{RunID: "r", ResultID: "m0", Reply: &events.ModelReply{Content: "a", Usage: &events.Usage{InputTokens: &in, OutputTokens: &out}}},
		events.StepCompleted{RunID: "r", ResultID: "a0", ActionOutcome: &events.ActionOutcome{Status: events.StatusExecuted}, Step: events.StepRecord{StepIdx: 0}},
		events.ModelCallResult{RunID: "r", ResultID: "m1", Reply: &events.ModelReply{Content: "b"}},
		events.StepCompleted{RunID: "r", ResultID: "a1", ActionOutcome: &failed, Step: events.StepRecord{StepIdx: 1}},
	}
	stream := envelopes(evs)
	if got := report.EnvErrors(stream); !reflect.DeepEqual(got, []report.EnvError{{Step: 1, Cause: cause}}) {
		t.Errorf("env errors %+v", got)
	}
	tokens := report.StepTokens(projections.Fold(stream))
	if len(tokens) != 2 || tokens[0] == nil || *tokens[0].InputTokens != 10 || tokens[1] != nil {
		t.Errorf("step tokens %+v", tokens)
	}
}

// TestStepTokensOfAStepWithoutItsModelResult: a damaged log (a step with
// no model result) gives no usage for it, not a panic.
func TestStepTokensOfAStepWithoutItsModelResult(t *testing.T) {
	stream := envelopes([]events.Event{events.StepCompleted{RunID: "r", Step: events.StepRecord{StepIdx: 0}}})
	if got := report.StepTokens(projections.Fold(stream)); len(got) != 1 || got[0] != nil {
		t.Fatalf("%v", got)
	}
}

func TestPlural(t *testing.T) {
	for n, want := range map[int]string{0: "0 steps", 1: "1 step", 2: "2 steps"} {
		if got := report.Plural(n, "step"); got != want {
			t.Errorf("Plural(%d) = %q", n, got)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// damagedEntries is a store whose index lists some runs damaged, as kv
// and pgstore list an entry that fails its checksum; loading them reports
// the damage.
type damagedEntries struct {
	*seamstest.MemStore
	damaged map[string]bool
}

func (s damagedEntries) Runs(ctx context.Context) ([]seams.RunInfo, error) {
	infos, err := s.MemStore.Runs(ctx)
	for i, info := range infos {
		if s.damaged[info.RunID] {
			infos[i] = seams.RunInfo{RunID: info.RunID, Status: seams.StatusCorrupt}
		}
	}
	return infos, err
}

func (s damagedEntries) Load(ctx context.Context, runID string) ([]events.Envelope, error) {
	stream, err := s.MemStore.Load(ctx, runID)
	if s.damaged[runID] {
		return stream, &events.DamageError{RunID: runID, Problems: []error{errors.New("its index entry fails its checksum")}}
	}
	return stream, err
}

// TestAListingSpeaksTheIndexsStatuses: a run's status is one word wherever
// it is read: a listing says finished, running or corrupt exactly where a
// store's index does (in_doubt is the listing's alone: only the log tells
// a crash mid-call from a run between steps).
func TestAListingSpeaksTheIndexsStatuses(t *testing.T) {
	ctx := context.Background()
	store := damagedEntries{&seamstest.MemStore{}, map[string]bool{"damaged": true}}
	sound := func(id string) []events.Event { return proptest.SoundStream(id) }
	proptest.AppendEach(t, store.MemStore, "finished", sound("finished"))
	proptest.AppendEach(t, store.MemStore, "running", sound("running")[:5])
	proptest.AppendEach(t, store.MemStore, "in-doubt", sound("in-doubt")[:4])
	proptest.AppendEach(t, store.MemStore, "damaged", sound("damaged")[:3])
	infos, err := store.Runs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	indexed := map[string]seams.RunStatus{}
	for _, info := range infos {
		indexed[info.RunID] = info.Status
	}
	runs, err := report.List(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range runs {
		want := indexed[r.Info.RunID]
		if r.Info.RunID == "in-doubt" {
			want = seams.StatusInDoubt
		}
		if r.Status != want {
			t.Errorf("run %q: listed %s, its index says %s", r.Info.RunID, r.Status, indexed[r.Info.RunID])
		}
	}
}
