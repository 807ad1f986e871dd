package report_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/report"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// listed is a store whose listing says of each run what entries set: its
// holder and queue, as kv and pgstore fill them, and, when status is set,
// the status the store gives (a store that applies no liveness lists its
// index's "running").
type listed struct {
	*seamstest.MemStore
	entries map[string]func(*seams.RunInfo)
}

func (s listed) Runs(ctx context.Context) ([]seams.RunInfo, error) {
	infos, err := s.MemStore.Runs(ctx)
	for i := range infos {
		if set := s.entries[infos[i].RunID]; set != nil {
			set(&infos[i])
		}
	}
	return infos, err
}

// TestAStatusIsTheStoresLivenessRefinedByTheLog: one row per rule of a
// listing's status. A run a live driver holds is running whatever its tail
// and no plan for Resume is shown for it; a run nobody holds is in_doubt
// where its tail leaves a side effect's outcome unknown, else awaiting or
// interrupted as the store's holder and queue say; the log alone says
// finished and corrupt.
func TestAStatusIsTheStoresLivenessRefinedByTheLog(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	future, past := now.Add(time.Hour), now.Add(-time.Hour)
	doubt := func(id string) []events.Event { return proptest.SoundStream(id)[:4] }   // a never action's intent, no outcome
	between := func(id string) []events.Event { return proptest.SoundStream(id)[:5] } // after step 0
	awaitingApproval := func(id string) []events.Event { return append(proptest.SoundStream(id)[:3:3], awaitsApproval(id)) }
	awaitingResolution := func(id string) []events.Event {
		in := proptest.SoundStream(id)[3].(events.Intent)
		in.Awaits = events.AwaitsResolution
		return append(proptest.SoundStream(id)[:4:4], in)
	}
	corrupt := func(id string) []events.Event {
		s := proptest.SoundStream(id)
		return append(s[:1:1], s[2:5]...) // a model result without its intent
	}
	// listedLive is what a store lists once set filled the entry's holder
	// and queue: the index's word, then its liveness.
	listedLive := func(set func(*seams.RunInfo)) func(*seams.RunInfo) {
		return func(i *seams.RunInfo) {
			if i.Status != seams.StatusFinished && i.Status != seams.StatusCorrupt {
				i.Status = seams.StatusRunning
			}
			set(i)
			i.Liveness(now)
		}
	}
	held := func(owner string, until time.Time) func(*seams.RunInfo) {
		return listedLive(func(i *seams.RunInfo) { i.Owner, i.LeaseExpires = owner, until })
	}
	cases := []struct {
		name     string
		stream   func(string) []events.Event
		entry    func(*seams.RunInfo)
		status   seams.RunStatus
		verdict  string
		plan     recovery.Plan // "" when none is shown
		inDoubt  bool
		holder   string
		liveness string // a part of it
	}{
		{"held, a side effect in its tail: running, no plan", doubt, held("w1", future),
			seams.StatusRunning, "running", "", false, "w1 until ", "w1 drives it (lease until "},
		{"held for its process's life (no lease): running, no plan", doubt, held(seamstest.MemOwner, time.Time{}),
			seams.StatusRunning, "running", "", false, seamstest.MemOwner, "memstore drives it"},
		{"held between steps: running, no plan", between, held("w1", future),
			seams.StatusRunning, "running", "", false, "w1 until ", "w1 drives it"},
		{"nobody holds it, a side effect in doubt: in_doubt with the plan", doubt, held("", time.Time{}),
			seams.StatusInDoubt, report.Resumable, recovery.PlanStopUnknown, true, "-", "nobody drives it (its driver stopped)"},
		{"the holder's lease ran out, a side effect in doubt: in_doubt with the plan", doubt, held("w2", past),
			seams.StatusInDoubt, report.Resumable, recovery.PlanStopUnknown, true, "lease of w2 ran out at ", "nobody drives it (lease of w2 ran out at "},
		{"the holder's lease ran out between steps: interrupted", between, held("w2", past),
			seams.StatusInterrupted, report.Resumable, recovery.PlanNextStep, false, "lease of w2 ran out at ", "lease of w2 ran out"},
		{"queued for an agent, nobody holds it: awaiting", between, listedLive(func(i *seams.RunInfo) {
			i.Agent, i.Failures, i.LastError, i.RetryAt = "reviewer", 2, "model 503", future
		}), seams.StatusAwaiting, report.Resumable, recovery.PlanNextStep, false, "-",
			"it waits for a worker of agent reviewer; given back after 2 failures, the last: model 503, claimable again at "},
		{"queued for an agent, a side effect in doubt: in_doubt", doubt, listedLive(func(i *seams.RunInfo) { i.Agent = "reviewer" }),
			seams.StatusInDoubt, report.Resumable, recovery.PlanStopUnknown, true, "-", "waits for a worker of agent reviewer"},
		{"a store that lists running and names no holder: nobody holds it", between, func(i *seams.RunInfo) { i.Status = seams.StatusRunning },
			seams.StatusInterrupted, report.Resumable, recovery.PlanNextStep, false, "-", "nobody drives it"},
		{"a store that lists running, a lease that ran out since: interrupted", between, func(i *seams.RunInfo) {
			i.Status, i.Owner, i.LeaseExpires = seams.StatusRunning, "w3", past
		},
			seams.StatusInterrupted, report.Resumable, recovery.PlanNextStep, false, "lease of w3 ran out", "lease of w3"},
		{"an entry that says finished beside an unfinished stream (a run replaced since) is judged by its holder", between,
			func(i *seams.RunInfo) { i.Status = seams.StatusFinished },
			seams.StatusInterrupted, report.Resumable, recovery.PlanNextStep, false, "-", "nobody drives it"},
		{"a store that says interrupted is believed (its clock ran the lease out)", between, func(i *seams.RunInfo) {
			i.Status, i.Owner, i.LeaseExpires = seams.StatusInterrupted, "w4", future
		}, seams.StatusInterrupted, report.Resumable, recovery.PlanNextStep, false, "-", "nobody drives it"},
		{"a cancel request is said", between, listedLive(func(i *seams.RunInfo) {
			i.Owner, i.LeaseExpires, i.CancelRequested = "w1", future, &seams.CancelRequest{By: "ops", At: now}
		}), seams.StatusRunning, "running", "", false, "w1 until ", "; cancel requested by ops at "},
		{"nobody holds it, an action awaits approval: awaiting_approval, a person's decision awaited", awaitingApproval, held("", time.Time{}),
			seams.StatusAwaitingApproval, "awaiting_approval", recovery.PlanAwaitDecision, false, "-", "nobody drives it; it waits for a person's decision"},
		{"an agent's run awaiting approval waits for a person, not a worker", awaitingApproval, listedLive(func(i *seams.RunInfo) { i.Agent = "reviewer" }),
			seams.StatusAwaitingApproval, "awaiting_approval", recovery.PlanAwaitDecision, false, "-", "waits for a person's decision (approve or reject"},
		{"its last holder's lease ran out, an action awaits approval: awaiting_approval", awaitingApproval, held("w2", past),
			seams.StatusAwaitingApproval, "awaiting_approval", recovery.PlanAwaitDecision, false, "-", "waits for a person's decision"},
		{"an action in doubt awaits an operator's finding: awaiting_resolution", awaitingResolution, listedLive(func(i *seams.RunInfo) { i.Agent = "reviewer" }),
			seams.StatusAwaitingResolution, "awaiting_resolution", recovery.PlanAwaitDecision, true, "-", "waits for an operator's finding"},
		{"held, an action awaiting approval in its tail: running", awaitingApproval, held("w1", future),
			seams.StatusRunning, "running", "", false, "w1 until ", "w1 drives it"},
		{"finished, whoever the listing names", proptest.SoundStream, held("w1", future),
			seams.StatusFinished, "finished", recovery.PlanReturnResult, false, "-", ""},
		{"corrupt, held or not", corrupt, held("w1", future),
			seams.StatusCorrupt, "corrupt", "", false, "-", ""},
	}
	for _, c := range cases {
		store := listed{&seamstest.MemStore{}, map[string]func(*seams.RunInfo){"r": c.entry}}
		proptest.AppendEach(t, store.MemStore, "r", c.stream("r"))
		runs, err := report.List(ctx, store)
		if err != nil || len(runs) != 1 {
			t.Fatalf("%s: %d runs, %v", c.name, len(runs), err)
		}
		r := runs[0]
		stream, _ := store.Load(ctx, "r")
		v := report.Verdict(r, stream)
		var plan recovery.Plan
		if v.Plan != nil {
			plan = *v.Plan
		}
		if r.Status != c.status || v.Status != c.status || v.Verdict != c.verdict || plan != c.plan || (v.PlanText != nil) != (c.plan != "") ||
			(v.InDoubt != nil) != c.inDoubt {
			b, _ := json.Marshal(v)
			t.Errorf("%s: status %s, verdict %s; want %s, %s, plan %q, in doubt %t", c.name, r.Status, b, c.status, c.verdict, c.plan, c.inDoubt)
		}
		if got := r.Holder(); !strings.HasPrefix(got, c.holder) {
			t.Errorf("%s: holder %q, want it to begin %q", c.name, got, c.holder)
		}
		if got := r.Liveness(); !strings.Contains(got, c.liveness) || (c.liveness == "") != (got == "") {
			t.Errorf("%s: liveness %q, want it to hold %q", c.name, got, c.liveness)
		}
		if got := r.Liveness(); (c.status == seams.StatusAwaitingApproval || c.status == seams.StatusAwaitingResolution) && strings.Contains(got, "worker") {
			t.Errorf("%s: liveness %q: a run awaiting a person does not wait for a worker", c.name, got)
		}
		if got := r.JSON(); got.Status != c.status {
			t.Errorf("%s: the listing JSON says %s", c.name, got.Status)
		}
	}
}

// awaitsApproval is the intent of runID's step 0 action, a refund awaiting
// approval (in place of SoundStream's list).
func awaitsApproval(runID string) events.Intent {
	return events.Intent{RunID: runID, IntentKind: events.IntentAction, CallIndex: 0, ResultID: "r0a", ReplayPolicy: events.ReplayNever,
		ToolName: "refund", Awaits: events.AwaitsApproval, Arguments: `{"amount":250}`,
		ArgumentsSchema: `{"type":"object","properties":{"amount":{"type":"number"}}}`}
}

// TestLiveJudgesAnEntryByItsHolder: one row per rule of an unfinished
// run's liveness from its entry.
func TestLiveJudgesAnEntryByItsHolder(t *testing.T) {
	now := time.Now()
	future, past := now.Add(time.Hour), now.Add(-time.Hour)
	for _, c := range []struct {
		name   string
		info   seams.RunInfo
		status seams.RunStatus
	}{
		{"a live lease", seams.RunInfo{Status: seams.StatusRunning, Owner: "w", LeaseExpires: future}, seams.StatusRunning},
		{"a hold for the holder's life", seams.RunInfo{Status: seams.StatusRunning, Owner: "w"}, seams.StatusRunning},
		{"a lease run out since the store listed it", seams.RunInfo{Status: seams.StatusRunning, Owner: "w", LeaseExpires: past}, seams.StatusInterrupted},
		{"running, no holder named", seams.RunInfo{Status: seams.StatusRunning}, seams.StatusInterrupted},
		{"running, no holder named, an agent's", seams.RunInfo{Status: seams.StatusRunning, Agent: "a"}, seams.StatusAwaiting},
		{"the store says interrupted (its clock ran the lease out)", seams.RunInfo{Status: seams.StatusInterrupted, Owner: "w", LeaseExpires: future}, seams.StatusInterrupted},
		{"the store says awaiting", seams.RunInfo{Status: seams.StatusAwaiting, Agent: "a"}, seams.StatusAwaiting},
		{"an entry older than its stream says finished", seams.RunInfo{Status: seams.StatusFinished, Owner: "w", LeaseExpires: future}, seams.StatusRunning},
		{"an entry older than its stream says finished, nobody holds it", seams.RunInfo{Status: seams.StatusFinished}, seams.StatusInterrupted},
		{"a damaged entry", seams.RunInfo{Status: seams.StatusCorrupt}, seams.StatusInterrupted},
	} {
		if got := report.Live(c.info, now); got != c.status {
			t.Errorf("%s: %s, want %s", c.name, got, c.status)
		}
	}
}

// TestTheListingJSONCarriesTheRunsHolderAndQueue: runs --json and the
// viewer's /api/runs name the agent, holder, lease, failures, retry and
// cancel request, null where absent.
func TestTheListingJSONCarriesTheRunsHolderAndQueue(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	store := listed{&seamstest.MemStore{}, map[string]func(*seams.RunInfo){"q": func(i *seams.RunInfo) {
		i.Agent, i.Owner, i.LeaseExpires, i.Failures, i.LastError, i.RetryAt = "reviewer", "w1", at, 3, "boom", at.Add(time.Minute)
		i.CancelRequested = &seams.CancelRequest{By: "ops@host", At: at}
	}}}
	proptest.AppendEach(t, store.MemStore, "q", proptest.SoundStream("q")[:5])
	proptest.AppendEach(t, store.MemStore, "plain", proptest.SoundStream("plain"))
	runs, err := report.List(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range runs {
		var fields map[string]json.RawMessage
		b, _ := json.Marshal(r.JSON())
		if err := json.Unmarshal(b, &fields); err != nil {
			t.Fatal(err)
		}
		var parts []string
		for _, k := range []string{"agent", "owner", "lease_expires", "failures", "last_error", "retry_at", "cancel_requested"} {
			parts = append(parts, k+"="+string(fields[k]))
		}
		got[r.Info.RunID] = strings.Join(parts, " ")
	}
	want := map[string]string{
		"q": `agent="reviewer" owner="w1" lease_expires="2026-11-30T09:00:00.000Z" failures=3 last_error="boom" ` +
			`retry_at="2026-11-30T09:01:00.000Z" cancel_requested={"by":"ops@host","at":"2026-11-30T09:00:00.000Z"}`,
		"plain": `agent=null owner=null lease_expires=null failures=0 last_error=null retry_at=null cancel_requested=null`,
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("run %s:\n got %s\nwant %s", id, got[id], w)
		}
	}
}

// TestDescribeFindsOneRun: a RunDescriber is asked for the run alone;
// another store's listing is searched; a run in neither is ErrNoRun.
func TestDescribeFindsOneRun(t *testing.T) {
	ctx := context.Background()
	mem := &seamstest.MemStore{}
	proptest.AppendEach(t, mem, "r", proptest.SoundStream("r")[:5])
	for name, store := range map[string]seams.RunReader{"a RunDescriber": mem, "a RunReader alone": readerOnly{mem}} {
		info, err := report.Describe(ctx, store, "r")
		if err != nil || info.RunID != "r" || info.Status != seams.StatusInterrupted || info.Events != 5 {
			t.Errorf("%s: %+v, %v", name, info, err)
		}
		if _, err := report.Describe(ctx, store, "ghost"); !errors.Is(err, seams.ErrNoRun) || !strings.Contains(err.Error(), `no run "ghost"`) {
			t.Errorf("%s: a run not in the store: %v", name, err)
		}
	}
}

// readerOnly is a store that is a seams.RunReader and nothing more.
type readerOnly struct{ seams.RunReader }

func TestClock(t *testing.T) {
	now := time.Date(2026, 11, 30, 23, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		t    time.Time
		want string
	}{
		{now.Add(30 * time.Second), "23:00:30Z"},
		{now.Add(2 * time.Hour), "2026-12-01T01:00:00Z"},
		{now.In(time.FixedZone("CET", 3600)), "23:00:00Z"},
	} {
		if got := report.Clock(c.t, now); got != c.want {
			t.Errorf("Clock(%v) = %q, want %q", c.t, got, c.want)
		}
	}
}
