package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
	"github.com/polyloop/polyloop/stores"
)

// ledger records what the fixture's tools did: each execution's tool,
// run and arguments.
type ledger struct {
	mu    sync.Mutex
	lines []string
}

func (l *ledger) add(tool string, ctx context.Context, args map[string]any) (string, error) {
	call, _ := seams.CallOf(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf("%s %s %v", call.RunID, tool, args["amount"]))
	return fmt.Sprintf("%s of %v done", tool, args["amount"]), nil
}

// of is what the tools did in runID.
func (l *ledger) of(runID string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		if strings.HasPrefix(line, runID+" ") {
			out = append(out, line)
		}
	}
	return out
}

// decisionRun is how the fixture's runs are started and resumed: refund
// (amount at most 500) requires approval; pay is a never tool without.
func decisionRun(t *testing.T, store seams.RunStore, l *ledger, runID, agent string, crashAfter int, first string) (events.RunResult, error) {
	t.Helper()
	amount := map[string]any{"type": "object", "required": []string{"amount"}, "additionalProperties": false,
		"properties": map[string]any{"amount": map[string]any{"type": "number", "maximum": 500}}}
	reg, err := seams.NewRegistry(
		seams.Tool{Spec: seams.ToolSpec{Name: "refund", RequiresApproval: true, Parameters: amount},
			Handler: func(ctx context.Context, a map[string]any) (string, error) { return l.add("refund", ctx, a) }},
		seams.Tool{Spec: seams.ToolSpec{Name: "pay", Parameters: amount},
			Handler: func(ctx context.Context, a map[string]any) (string, error) { return l.add("pay", ctx, a) }},
	)
	if err != nil {
		t.Fatal(err)
	}
	if crashAfter >= 0 {
		store = &proptest.CrashingStore{Inner: store, After: crashAfter}
	}
	def := engine.Definition{Model: &seamstest.Model{Turns: seamstest.Replies(first, `FINAL: done`)}, Parser: seamstest.Parser{}, Store: store}
	req := engine.Request{RunID: runID, Agent: agent, Tools: reg, Executor: reg.Executor(), ModelReplayPolicy: events.ReplaySafe,
		OneEventPerTransaction: true,
		Budget:                 engine.Budget{MaxSteps: 5, MaxActions: 5, MaxConsecutiveParseFailures: 2, MaxPromptChars: 10_000}}
	res, err := engine.Resume(context.Background(), def, req)
	if errors.Is(err, engine.ErrRunNotFound) {
		res, err = engine.Run(context.Background(), def, req)
	}
	return res, err
}

// awaitRefund starts runID, which waits for approval of a refund of 250,
// and returns the call's id.
func awaitRefund(t *testing.T, store seams.RunStore, l *ledger, runID, agent string) string {
	t.Helper()
	_, err := decisionRun(t, store, l, runID, agent, -1, `TOOL refund {"amount":250}`)
	var awaiting *engine.AwaitingError
	if !errors.As(err, &awaiting) || len(awaiting.Calls) != 1 {
		t.Fatalf("run %s: %v, want it awaiting approval", runID, err)
	}
	return awaiting.Calls[0].Call
}

// payInDoubt starts runID, whose pay of 5 runs and is then left in doubt
// by a crash before its outcome is durable, and returns the call's id.
func payInDoubt(t *testing.T, store seams.RunStore, l *ledger, runID string) string {
	t.Helper()
	// run_started, model intent, model result, action intent: then the
	// pay runs, and its step_completed is never written.
	if _, err := decisionRun(t, store, l, runID, "", 4, `TOOL pay {"amount":5}`); !errors.Is(err, proptest.ErrCrashed) {
		t.Fatalf("run %s: %v, want the crash", runID, err)
	}
	stream, err := store.Load(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	in, ok := stream[len(stream)-1].Event.(events.Intent)
	if !ok || in.IntentKind != events.IntentAction || len(l.of(runID)) != 1 {
		t.Fatalf("run %s does not end in the pay's intent: %+v, ledger %v", runID, stream[len(stream)-1].Event, l.of(runID))
	}
	return in.ResultID
}

// events of runID in the store at target, to show nothing was written.
func eventCount(t *testing.T, target, runID string) int {
	t.Helper()
	s, err := stores.Open(context.Background(), target, stores.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	stream, err := s.Load(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	return len(stream)
}

// lastStep is the last StepRecord of a result.
func lastStep(t *testing.T, r events.RunResult, i int) events.StepRecord {
	t.Helper()
	if len(r.Steps) <= i {
		t.Fatalf("%d steps, want step %d", len(r.Steps), i)
	}
	return r.Steps[i]
}

// TestDecisionsOnAFile: approve (as the model asked, and with edited
// arguments), reject and resolve through the command on a bbolt file;
// each says what the run does next, and the run, resumed, does it: an
// approved refund runs once, with the edited arguments when there are; a
// rejected one never runs and the model is told the note; a pay found
// executed is not run again and the model is told the observation.
func TestDecisionsOnAFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	s, err := kv.Open(path, kv.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	l := &ledger{}
	approve, reject, edit := awaitRefund(t, s, l, "approve", ""), awaitRefund(t, s, l, "reject", ""), awaitRefund(t, s, l, "edit", "")
	doubt, gone := payInDoubt(t, s, l, "doubt"), payInDoubt(t, s, l, "gone")
	s.Close()

	for _, c := range []struct {
		args []string
		out  string
	}{
		{[]string{"approve", "--by", "ana", "--note", "customer verified", path, "approve", approve},
			"approve: call " + approve + " (refund) approved by ana\n  when the run goes on it runs, once; the program that runs it resumes it (engine.Resume)\n"},
		{[]string{"reject", path, "reject", reject, "--by", "bo", "--note", "the order was never paid"},
			"reject: call " + reject + " (refund) rejected by bo\n  when the run goes on the step completes not executed, the model told \"rejected by reviewer: the order was never paid\"; the program that runs it resumes it (engine.Resume)\n"},
		{[]string{"approve", "--by", "ana", "--arguments", `{"amount": 120}`, path, "edit", edit},
			"edit: call " + edit + " (refund) approved by ana, with arguments {\"amount\":120}\n  when the run goes on it runs, once; the program that runs it resumes it (engine.Resume)\n"},
		{[]string{"resolve", "--by", "ops", "--executed", "--observation", "payment p-7 is in the ledger", path, "doubt", doubt},
			"doubt: call " + doubt + " (pay) found executed by ops\n  when the run goes on the step completes executed without running it again, the model told \"payment p-7 is in the ledger\"; the program that runs it resumes it (engine.Resume)\n"},
		{[]string{"resolve", "--not-executed", "--by", "ops", path, "gone", gone},
			"gone: call " + gone + " (pay) found not executed by ops\n  when the run goes on the step completes not executed, without running it; the program that runs it resumes it (engine.Resume)\n"},
	} {
		if code, out := admin(c.args...); code != exitOK || out != c.out {
			t.Errorf("%q: exit %d\n%s\nwant\n%s", c.args, code, out, c.out)
		}
	}

	s, err = kv.Open(path, kv.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, c := range []struct {
		run, first  string
		ledger      string // what the tools did in the run, in all
		status      events.ActionStatus
		observation string
	}{
		{"approve", `TOOL refund {"amount":250}`, "[approve refund 250]", events.StatusExecuted, "refund of 250 done"},
		{"reject", `TOOL refund {"amount":250}`, "[]", events.StatusNotExecuted, "rejected by reviewer: the order was never paid"},
		{"edit", `TOOL refund {"amount":250}`, "[edit refund 120]", events.StatusExecuted, "refund of 120 done"},
		{"doubt", `TOOL pay {"amount":5}`, "[doubt pay 5]", events.StatusExecuted, "payment p-7 is in the ledger"},
		{"gone", `TOOL pay {"amount":5}`, "[gone pay 5]", events.StatusNotExecuted, ""},
	} {
		r, err := decisionRun(t, s, l, c.run, "", -1, c.first)
		if err != nil || r.StopReason != events.StopAgentFinished {
			t.Fatalf("run %s resumed: %s, %v", c.run, r.StopReason, err)
		}
		step := lastStep(t, r, 0)
		if got := fmt.Sprint(l.of(c.run)); got != c.ledger || step.ActionStatus == nil || *step.ActionStatus != c.status ||
			!strings.Contains(step.Observation, c.observation) {
			t.Errorf("run %s: the tools did %s, the step %v %q; want %s, %s %q", c.run, got, step.ActionStatus, step.Observation, c.ledger, c.status, c.observation)
		}
	}
}

// TestDecisionsRefused: each refusal says why and exits 1, writing
// nothing: a call decided already (by whom), one awaiting another kind of
// decision or none, a call not in the run, a run not in the store or
// damaged, edited arguments the tool's schema refuses.
func TestDecisionsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	s, err := kv.Open(path, kv.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	l := &ledger{}
	decided, waiting := awaitRefund(t, s, l, "decided", ""), awaitRefund(t, s, l, "waiting", "")
	doubt := payInDoubt(t, s, l, "doubt")
	proptest.AppendEach(t, s, "done", proptest.SoundStream("done"))
	// A damaged log (kv keeps the start and finish rules alone, so it
	// takes a model result without its intent).
	failure := "x"
	if _, err := s.Append(context.Background(), "damaged", ulid.ULID{}, events.RunStarted{RunID: "damaged", SchemaVersion: events.CurrentSchemaVersion},
		events.ModelCallResult{RunID: "damaged", ResultID: "orphan", Failure: &failure}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if code, out := admin("approve", "--by", "ana", path, "decided", decided); code != exitOK {
		t.Fatalf("approve: %d\n%s", code, out)
	}
	counts := map[string]int{}
	for _, id := range []string{"decided", "waiting", "doubt", "done", "damaged"} {
		counts[id] = eventCount(t, path, id)
	}
	for _, c := range []struct {
		args []string
		err  string
	}{
		{[]string{"approve", path, "decided", decided},
			`polyloop-admin: approve: call "` + decided + `" of run "decided" is decided already: approved by "ana"`},
		{[]string{"reject", "--note", "no", path, "decided", decided},
			`polyloop-admin: reject: call "` + decided + `" of run "decided" is decided already: approved by "ana"`},
		{[]string{"resolve", "--not-executed", path, "waiting", waiting},
			`polyloop-admin: resolve: call "` + waiting + `" of run "waiting": its outcome is not in doubt (state awaiting_approval: the action has not run)`},
		{[]string{"approve", path, "doubt", doubt},
			`polyloop-admin: approve: call "` + doubt + `" of run "doubt": it awaits no approval (state action_unknown)`},
		{[]string{"approve", path, "done", "r0a"},
			`polyloop-admin: approve: call "r0a" of run "done": the action of step 0 has completed`},
		{[]string{"approve", path, "done", "r0m"},
			`polyloop-admin: approve: call "r0m" of run "done": "r0m" is the model call of step 0, not an action`},
		{[]string{"approve", path, "waiting", "nope"},
			`polyloop-admin: approve: run "waiting" has no call "nope" (polyloop-inspect verify STORE RUN names the call that waits)`},
		{[]string{"reject", path, "ghost", waiting},
			`polyloop-admin: reject: no run "ghost" in ` + stores.Describe(path)},
		{[]string{"approve", "--arguments", `{"amount":900}`, path, "waiting", waiting},
			`polyloop-admin: approve: refused, nothing recorded: edited arguments: seams: invalid tool arguments for "refund": ` +
				"jsonschema validation failed with 'polyloop:tool/refund#'\n- at '/amount': maximum: got 900, want 500"},
		{[]string{"approve", "--arguments", `{"amount":5,"currency":"EUR"}`, path, "waiting", waiting},
			`polyloop-admin: approve: refused, nothing recorded: edited arguments: seams: invalid tool arguments for "refund": ` +
				"jsonschema validation failed with 'polyloop:tool/refund#'\n- at '': additional properties 'currency' not allowed"},
	} {
		code, out := admin(c.args...)
		if code != exitProblem || out != c.err+"\n" {
			t.Errorf("%q: exit %d\n%s\nwant exit 1 and\n%s", c.args, code, out, c.err)
		}
	}
	if code, out := admin("resolve", "--not-executed", path, "damaged", "orphan"); code != exitProblem ||
		!strings.HasPrefix(out, `polyloop-admin: resolve: run "damaged" is damaged, nothing recorded (polyloop-inspect verify says how): `) ||
		!strings.Contains(out, `model result "orphan" without a model intent`) {
		t.Errorf("resolve in a damaged run: exit %d\n%s", code, out)
	}
	for id, n := range counts {
		if got := eventCount(t, path, id); got != n {
			t.Errorf("run %s: %d events after the refusals, %d before", id, got, n)
		}
	}
}

// TestDecisionUsage: what the command line gets wrong is bad usage (exit
// 2), said before the store is opened.
func TestDecisionUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		err  string
	}{
		{[]string{"approve", "x.db", "r"}, "want STORE, RUN and CALL"},
		{[]string{"reject", "x.db", "r", "c", "d"}, "want STORE, RUN and CALL"},
		{[]string{"approve", "--arguments", "amount=5", "x.db", "r", "c"}, `--arguments: "amount=5" is not JSON`},
		{[]string{"approve", "--arguments", "[5]", "x.db", "r", "c"}, `--arguments: "[5]" is not a JSON object`},
		{[]string{"reject", "--arguments", "{}", "x.db", "r", "c"}, "--arguments is not a flag of reject"},
		{[]string{"approve", "--executed", "x.db", "r", "c"}, "--executed is not a flag of approve"},
		{[]string{"resolve", "x.db", "r", "c"}, "say what became of the action"},
		{[]string{"resolve", "--executed", "--not-executed", "x.db", "r", "c"}, "say what became of the action"},
		{[]string{"resolve", "--executed", "x.db", "r", "c"}, "--executed needs --observation"},
		{[]string{"resolve", "--not-executed", "--observation", "seen", "x.db", "r", "c"}, "--observation goes with --executed"},
		{[]string{"cancel", "--note", "x", "x.db", "r"}, "--note is not a flag of cancel"},
	} {
		code, out := admin(c.args...)
		if code != exitUsage || !strings.Contains(out, c.err) || !strings.Contains(out, "Usage:") {
			t.Errorf("%q: exit %d\n%s\nwant exit 2 and %q", c.args, code, out, c.err)
		}
	}
	for _, args := range [][]string{{"approve", "--help"}, {"reject", "-h"}, {"resolve", "--help"}} {
		if code, out := admin(args...); code != exitOK || !strings.Contains(out, "polyloop-admin approve [--by NAME]") {
			t.Errorf("%q: exit %d\n%s", args, code, out)
		}
	}
}

// TestADecisionWaitsForNoDriver: a run a driver holds is not decided on
// behind its back: after a short wait the decision is refused, saying
// so; and an agent's run, once decided, is handed back to its workers.
func TestADecisionWaitsForNoDriver(t *testing.T) {
	ctx := context.Background()
	s := &seamstest.MemStore{}
	l := &ledger{}
	call := awaitRefund(t, s, l, "queued", "refunds")
	release, err := s.LockRun("queued")
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut strings.Builder
	d := events.Decision{RunID: "queued", ResultID: call, Verdict: events.VerdictApproved, By: "ana"}
	if code := decide(ctx, s, "STORE", "approve", d, &out, &errOut); code != exitProblem || out.Len() != 0 ||
		!strings.HasPrefix(errOut.String(), `polyloop-admin: approve: run "queued" is driven by another process now; nothing recorded, try again once it waits: `) {
		t.Fatalf("a held run: exit %d\n%s%s", code, out.String(), errOut.String())
	}
	release()
	errOut.Reset()
	if code := decide(ctx, s, "STORE", "approve", d, &out, &errOut); code != exitOK ||
		out.String() != "queued: call "+call+" (refund) approved by ana\n  when the run goes on it runs, once; it is handed back to the workers of agent refunds\n" {
		t.Fatalf("exit %d\n%s%s", code, out.String(), errOut.String())
	}
}

// TestApproveOnPostgres: approve through a postgres:// URL; the run,
// resumed, refunds once.
func TestApproveOnPostgres(t *testing.T) {
	url := pgtest.StoreURL(t)
	s, err := stores.Open(context.Background(), url, stores.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := &ledger{}
	call := awaitRefund(t, s, l, "pg", "")
	if code, out := admin("approve", "--by", "ana", url, "pg", call); code != exitOK || !strings.HasPrefix(out, "pg: call "+call+" (refund) approved by ana\n") {
		t.Fatalf("approve: %d\n%s", code, out)
	}
	if code, out := admin("reject", url, "pg", call); code != exitProblem || !strings.Contains(out, `is decided already: approved by "ana"`) {
		t.Fatalf("reject after the approval: %d\n%s", code, out)
	}
	r, err := decisionRun(t, s, l, "pg", "", -1, `TOOL refund {"amount":250}`)
	if err != nil || r.StopReason != events.StopAgentFinished || fmt.Sprint(l.of("pg")) != "[pg refund 250]" {
		t.Fatalf("resumed: %s, %v; the tools did %v", r.StopReason, err, l.of("pg"))
	}
}
