package proptest_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"pgregory.net/rapid"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/internal/soak"
	"github.com/polyloop/polyloop/projections"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// A decided scenario is a generated run with tool calls that need a
// person's approval — refund always (ToolSpec.RequiresApproval), pay over
// a limit and count of a "secret" directory when the request has the
// approval policy — and the person's verdict at each step that waits:
// approve, approve with edited arguments, or reject. Actions a crash
// leaves in doubt are handled as the scenario's mode says: left to stop
// the run resume_state_unknown ("unknown"), resolved by an operator before
// the run is resumed ("resolve"), or awaited by the run and resolved then
// (Request.AwaitResolution, "await").
type decidedScenario struct {
	turns    []seamstest.Turn
	calls    []*seams.ToolCall // per step: the tool call the reply asks for, nil if none
	verdicts []string          // per step: approve, edit, reject
	envFails []bool            // per step: the tool's environment fails
	limit    int               // the approval policy's limit; -1: no policy
	mode     string            // unknown, resolve, await
	dies     bool              // a crash at an action's intent comes before the action, not after
	budget   engine.Budget
	model    events.ReplayPolicy
	oneEvent bool
}

var decidedKinds = []string{"refund", "refund", "pay-small", "pay-large", "pay-large", "count", "secret-count",
	"invalid-args", "toolless", "final", "garbage", "model-error"}

func drawDecidedScenario(t *rapid.T) decidedScenario {
	n := rapid.IntRange(1, 7).Draw(t, "turns")
	s := decidedScenario{
		limit:    rapid.SampledFrom([]int{-1, 100, 100}).Draw(t, "approval_limit"),
		mode:     rapid.SampledFrom([]string{"unknown", "resolve", "await"}).Draw(t, "in_doubt"),
		dies:     rapid.Bool().Draw(t, "dies_before_acting"),
		model:    rapid.SampledFrom([]events.ReplayPolicy{events.ReplaySafe, events.ReplaySafe, events.ReplayNever}).Draw(t, "model_policy"),
		oneEvent: rapid.Bool().Draw(t, "one_event_per_transaction"),
		budget: engine.Budget{MaxSteps: rapid.IntRange(1, 8).Draw(t, "max_steps"), MaxActions: rapid.IntRange(1, 8).Draw(t, "max_actions"),
			MaxConsecutiveParseFailures: 2, MaxPromptChars: 100_000},
	}
	for i := range n {
		kind := rapid.SampledFrom(decidedKinds).Draw(t, fmt.Sprint("turn_", i))
		var content string
		switch kind {
		case "refund":
			content = fmt.Sprintf(`TOOL refund {"amount":%d}`, 10+i)
		case "pay-small":
			content = fmt.Sprintf(`TOOL pay {"amount":%d}`, i)
		case "pay-large":
			content = fmt.Sprintf(`TOOL pay {"amount":%d}`, 1000+i)
		case "count":
			content = fmt.Sprintf(`TOOL count {"dir":"d%d"}`, i)
		case "secret-count":
			content = fmt.Sprintf(`TOOL count {"dir":"secret%d"}`, i)
		case "invalid-args":
			content = `TOOL pay {"amount":"lots"}`
		case "toolless":
			content = fmt.Sprintf("ACTION: step %d", i)
		case "garbage":
			content = "let me think"
		case "final":
			content = fmt.Sprintf("FINAL: answer %d", i)
		}
		turn := seamstest.Turn{Reply: events.ModelReply{CallID: fmt.Sprintf("call-%d", i), Content: content}}
		if kind == "model-error" {
			turn = seamstest.Turn{Err: errors.New("upstream 503")}
		}
		s.turns = append(s.turns, turn)
		var call *seams.ToolCall
		if d, ok := (seamstest.Parser{}).Parse(turn.Reply).Decision.(seams.Action); ok && kind != "invalid-args" {
			call = d.ToolCall
		}
		s.calls = append(s.calls, call)
		s.verdicts = append(s.verdicts, rapid.SampledFrom([]string{"approve", "edit", "reject"}).Draw(t, fmt.Sprint("verdict_", i)))
		s.envFails = append(s.envFails, rapid.IntRange(0, 5).Draw(t, fmt.Sprint("env_fails_", i)) == 0)
	}
	return s
}

// needsApproval is the oracle's own reading of whether step i's call
// waits for a person: the scenario's rules, not the engine's.
func (s decidedScenario) needsApproval(i int) bool {
	if i >= len(s.calls) {
		return false // no reply scripted: the model call fails
	}
	c := s.calls[i]
	switch {
	case c == nil:
		return false
	case c.Name == "refund":
		return true
	case s.limit < 0:
		return false
	case c.Name == "pay":
		amount, _ := c.Arguments["amount"].(float64)
		return amount > float64(s.limit)
	}
	dir, _ := c.Arguments["dir"].(string)
	return c.Name == "count" && strings.HasPrefix(dir, "secret")
}

// edited is the arguments a reviewer who edits step i's call gives.
func (s decidedScenario) edited(i int) string {
	switch s.calls[i].Name {
	case "refund":
		return fmt.Sprintf(`{"amount":%d}`, 400+i)
	case "pay":
		return fmt.Sprintf(`{"amount":%d}`, 7000+i)
	}
	return fmt.Sprintf(`{"dir":"edited%d"}`, i)
}

// limitPolicy is the scenario's approval policy.
type limitPolicy int

func (p limitPolicy) RequiresApproval(a seams.Action) bool {
	tc := a.ToolCall
	if tc == nil {
		return false
	}
	if amount, ok := tc.Arguments["amount"].(float64); ok && tc.Name == "pay" {
		return amount > float64(p)
	}
	dir, _ := tc.Arguments["dir"].(string)
	return tc.Name == "count" && strings.HasPrefix(dir, "secret")
}

func (p limitPolicy) Parameters() map[string]string {
	return map[string]string{"limit": strconv.Itoa(int(p))}
}

// execution is one run of a tool handler, as the handler wrote it down.
type execution struct {
	seq         int
	step        int
	call        string
	args        map[string]any
	observation string
	envFailure  bool
}

// world is everything outside the engine for one crash point: the store,
// the tools' side-effect ledger (written by the handlers, read by the
// oracle), and what people did, in one sequence.
type world struct {
	s     decidedScenario
	store seams.RunStore
	runID string
	tools *seams.Registry
	model *seamstest.Model

	mu         sync.Mutex
	seq        int
	executions []execution
	approvedAt map[int]int // step → seq of its recorded approval
	resolvedAt map[int]int // step → seq of its recorded finding
	findings   map[int]events.Verdict
	decisions  []events.Decision // every decision recorded, in order
	asked      map[int]bool      // steps whose approval the engine asked for
}

func newWorld(t *rapid.T, s decidedScenario, store seams.RunStore, runID string) *world {
	w := &world{s: s, store: store, runID: runID, model: &seamstest.Model{Turns: s.turns},
		approvedAt: map[int]int{}, resolvedAt: map[int]int{}, findings: map[int]events.Verdict{}, asked: map[int]bool{}}
	handler := func(tool string) seams.ToolHandler {
		return func(ctx context.Context, args map[string]any) (string, error) {
			call, _ := seams.CallOf(ctx)
			b, _ := json.Marshal(args)
			e := execution{step: call.StepIdx, call: call.ResultID, args: args, observation: fmt.Sprintf("%s ran with %s", tool, b),
				envFailure: s.envFails[call.StepIdx]}
			w.mu.Lock()
			w.seq++
			e.seq = w.seq
			w.executions = append(w.executions, e)
			w.mu.Unlock()
			if e.envFailure {
				return "", seams.EnvFailure(errors.New("sandbox lost"))
			}
			return e.observation, nil
		}
	}
	object := func(name string, schema map[string]any) map[string]any {
		return map[string]any{"type": "object", "required": []string{name}, "properties": map[string]any{name: schema}}
	}
	reg, err := seams.NewRegistry(
		seams.Tool{Spec: seams.ToolSpec{Name: "count", ReplayPolicy: events.ReplaySafe, Parameters: object("dir", map[string]any{"type": "string"})},
			Handler: handler("count")},
		seams.Tool{Spec: seams.ToolSpec{Name: "pay", Parameters: object("amount", map[string]any{"type": "integer"})}, Handler: handler("pay")},
		seams.Tool{Spec: seams.ToolSpec{Name: "refund", RequiresApproval: true,
			Parameters: object("amount", map[string]any{"type": "number", "maximum": 500})}, Handler: handler("refund")},
	)
	if err != nil {
		t.Fatal(err)
	}
	w.tools = reg
	return w
}

// process is one process's handle on the world's store: it dies (every
// later append fails with ErrCrashed, writing nothing) after a number of
// appends — its own and those of the decisions people make through it —
// or, when the scenario says so, at the action announced by its last
// append, before the action runs.
type process struct {
	inner seams.RunStore
	after int // appends that succeed; negative: never dies
	dies  bool

	mu      sync.Mutex
	appends int
	dead    bool
}

func (p *process) Append(ctx context.Context, runID string, after ulid.ULID, evs ...events.Event) ([]events.Envelope, error) {
	p.mu.Lock()
	if p.dead || p.after >= 0 && p.appends >= p.after {
		p.dead = true
		p.mu.Unlock()
		return nil, proptest.ErrCrashed
	}
	p.appends++
	p.mu.Unlock()
	return p.inner.Append(ctx, runID, after, evs...)
}

func (p *process) Load(ctx context.Context, runID string) ([]events.Envelope, error) {
	return p.inner.Load(ctx, runID)
}

func (p *process) Parameters() map[string]string { return p.inner.Parameters() }

func (p *process) LockRun(runID string) (func(), error) {
	if l, ok := p.inner.(seams.RunLocker); ok {
		return l.LockRun(runID)
	}
	return func() {}, nil
}

func (p *process) HoldsRun(ctx context.Context, runID string) error {
	if l, ok := p.inner.(seams.RunLeaser); ok {
		return l.HoldsRun(ctx, runID)
	}
	return nil
}

// diesBeforeActing reports whether the process dies now, before the action
// its last append announced: it would die at its next append anyway.
func (p *process) diesBeforeActing() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dies && p.after >= 0 && p.appends == p.after {
		p.dead = true
	}
	return p.dead
}

// processExecutor is the tools' executor in one process: nothing runs
// once the process is dead.
type processExecutor struct {
	inner seams.ActionExecutor
	p     *process
}

func (e processExecutor) Execute(ctx context.Context, call seams.ActionCall) (events.ActionOutcome, error) {
	if e.p.diesBeforeActing() {
		return events.ActionOutcome{}, errors.New("the process died before the action ran")
	}
	return e.inner.Execute(ctx, call)
}

func (e processExecutor) Parameters() map[string]string { return e.inner.Parameters() }

// agent is the definition and request a process of w drives the run with.
func (w *world) agent(p *process) (engine.Definition, engine.Request) {
	req := engine.Request{RunID: w.runID, Budget: w.s.budget, Tools: w.tools, Executor: processExecutor{w.tools.Executor(), p},
		ModelReplayPolicy: w.s.model, OneEventPerTransaction: w.s.oneEvent, AwaitResolution: w.s.mode == "await",
		Context: engine.Context{GoalLevel: []seams.Message{seams.Text(seams.RoleUser, "goal")}}}
	if w.s.limit >= 0 {
		req.Approval = limitPolicy(w.s.limit)
	}
	return engine.Definition{Model: w.model, Parser: seamstest.Parser{}, Store: p}, req
}

// decidedStats counts what the property exercised, for its closing note.
var decidedStats struct {
	sync.Mutex
	runs, crashPoints, decideCrashes, resumeCrashes, unknown int
	verdicts                                                 map[string]int // decisions recorded, by verdict (edited apart)
	findings                                                 map[string]int // findings recorded, by mode and verdict
	rows                                                     map[recovery.State]int
	kinds                                                    map[string]int
}

func countDecided(f func()) {
	decidedStats.Lock()
	defer decidedStats.Unlock()
	f()
}

// life is one process of w: it runs (or resumes) the run, and whenever
// the run waits for a person, the person decides through the same
// process and the process resumes the run — until the run finishes or
// the process dies. In mode resolve, an action the log leaves in doubt is
// resolved before the run is resumed.
func (w *world) life(t *rapid.T, p *process, crash int) (events.RunResult, error) {
	ctx := context.Background()
	def, req := w.agent(p)
	stream, err := w.store.Load(ctx, w.runID)
	if err != nil {
		t.Fatal(err)
	}
	drive := engine.Resume
	if len(stream) == 0 {
		drive = engine.Run
	} else if v, err := recovery.Classify(w.runID, stream); err != nil {
		t.Fatalf("crash %d left a corrupt log: %v", crash, err)
	} else if w.s.mode == "resolve" && v.State == recovery.ActionUnknown && v.InDoubt.ReplayPolicy == events.ReplayNever {
		if err := w.resolve(t, p, crash, recovery.PendingCallOf(*v.InDoubt, time.Time{})); err != nil {
			return events.RunResult{}, err
		}
	}
	for {
		r, err := drive(ctx, def, req)
		drive = engine.Resume
		var aw *engine.AwaitingError
		if !errors.As(err, &aw) {
			return r, err
		}
		if len(aw.Calls) != 1 {
			t.Fatalf("crash %d: %d pending calls", crash, len(aw.Calls))
		}
		c := aw.Calls[0]
		if c.Awaits == events.AwaitsResolution {
			err = w.resolve(t, p, crash, c)
		} else {
			err = w.decide(t, p, crash, c)
		}
		if err != nil {
			return events.RunResult{}, err
		}
	}
}

// decide records the scenario's verdict on the call awaiting approval,
// after checking the engine asks for what the scenario's rules say needs
// approval.
func (w *world) decide(t *rapid.T, p *process, crash int, c recovery.PendingCall) error {
	i := c.Step
	if !w.s.needsApproval(i) {
		t.Fatalf("crash %d: step %d (%s) awaits approval, which the scenario's rules do not ask for", crash, i, c.Tool)
	}
	want := w.s.calls[i]
	if b, _ := json.Marshal(want.Arguments); c.Tool != want.Name || c.Arguments != string(b) {
		t.Fatalf("crash %d: step %d awaits approval of %s(%s), the model asked for %s(%s)", crash, i, c.Tool, c.Arguments, want.Name, b)
	}
	d := events.Decision{RunID: w.runID, ResultID: c.Call, By: "reviewer", Verdict: events.VerdictApproved}
	switch w.s.verdicts[i] {
	case "edit":
		args := w.s.edited(i)
		d.Arguments = &args
	case "reject":
		d.Verdict, d.Note = events.VerdictRejected, fmt.Sprintf("not step %d", i)
	}
	w.mu.Lock()
	w.asked[i] = true
	w.mu.Unlock()
	if _, err := engine.Decide(context.Background(), p, d); err != nil {
		if errors.Is(err, proptest.ErrCrashed) {
			countDecided(func() { decidedStats.decideCrashes++ })
			return err
		}
		t.Fatalf("crash %d: decide on step %d: %v", crash, i, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seq++
	if d.Verdict == events.VerdictApproved {
		w.approvedAt[i] = w.seq
	}
	w.decisions = append(w.decisions, d)
	return nil
}

// resolve records an honest operator's finding on the action in doubt:
// executed, with the observation its handler returned, when the ledger
// shows it ran; not executed otherwise.
func (w *world) resolve(t *rapid.T, p *process, crash int, c recovery.PendingCall) error {
	d := events.Decision{RunID: w.runID, ResultID: c.Call, By: "operator", Verdict: events.VerdictNotExecuted}
	w.mu.Lock()
	for _, e := range w.executions {
		if e.step == c.Step {
			obs := e.observation
			if e.envFailure {
				obs = "error: sandbox lost"
			}
			d.Verdict, d.Observation = events.VerdictExecuted, &obs
		}
	}
	w.mu.Unlock()
	if _, err := engine.Resolve(context.Background(), p, d); err != nil {
		if errors.Is(err, proptest.ErrCrashed) {
			countDecided(func() { decidedStats.decideCrashes++ })
			return err
		}
		t.Fatalf("crash %d: resolve step %d: %v", crash, c.Step, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seq++
	w.resolvedAt[c.Step], w.findings[c.Step] = w.seq, d.Verdict
	w.decisions = append(w.decisions, d)
	countDecided(func() { decidedStats.findings[w.s.mode+" "+string(d.Verdict)]++ })
	return nil
}

// TestPropertyDecisionsSurviveCrashes: generated runs whose tool calls
// need a person's approval (a tool's spec, a request's policy), with a
// generated verdict at each (approve, approve with edited arguments,
// reject) recorded with engine.Decide, and actions in doubt resolved with
// engine.Resolve (before resuming, or awaited with
// Request.AwaitResolution), on MemStore, kv and PostgreSQL (when a server
// is at hand). Each run is crashed at every write — the driver's and the
// decisions' alike: before an awaiting intent is durable, after it,
// after the decision, after the executing intent, after the outcome, and
// (drawn) between an intent and its action — then resumed, itself maybe
// crashed again, by processes that decide again what is asked again.
// The oracle is the tools' own ledger and the scenario's rules: the engine
// asks for approval exactly where the rules say; no never action runs
// twice, no action that needs approval runs before it is approved, a
// rejected one never runs, a resolved one never runs again, an edited one
// runs with the edited arguments; the log is sound; and the trajectory is
// the uncrashed run's (given the same replies and verdicts) wherever no
// outcome was in doubt, and where one was, up to the step resolved (and
// on, when the finding told the model what the uncrashed run observed),
// that step completed as found.
//
// Under the race detector, which slows it about five times, it generates a
// quarter of -rapid.checks (CI's time is shared by every property) under
// POLYLOOP_SOAK=1; the short count's quarter would draw too few runs to
// reach every recovery row and finding, which the test requires.
func TestPropertyDecisionsSurviveCrashes(t *testing.T) {
	if raceDetector && soak.On() {
		fewerChecks(t, 4)
	}
	stores := newStoreFactory(t)
	decidedStats.verdicts, decidedStats.findings = map[string]int{}, map[string]int{}
	decidedStats.rows, decidedStats.kinds = map[recovery.State]int{}, map[string]int{}
	rapid.Check(t, func(t *rapid.T) {
		s := drawDecidedScenario(t)
		// MemStore mostly: a crash point costs several times more on kv and
		// PostgreSQL, and the property's time is CI's.
		kind := rapid.SampledFrom(stores.kinds("memory", "memory", "memory", "memory", "memory", "memory", "kv")).Draw(t, "store")
		resumeCrash := rapid.SampledFrom([]int{-1, -1, 0, 1, 2, 4}).Draw(t, "resume_crash_after")

		// The uncrashed run, fed the same replies and verdicts.
		ref := newWorld(t, s, &seamstest.MemStore{}, "p")
		refProc := &process{inner: ref.store, after: -1}
		want, err := ref.life(t, refProc, -1)
		if err != nil {
			t.Fatalf("reference run: %v", err)
		}
		if want.StopReason == events.StopResumeStateUnknown || want.StopReason == events.StopCancelled {
			t.Fatalf("reference stopped with %s", want.StopReason)
		}
		for i := range want.Steps {
			if ref.asked[i] != s.needsApproval(i) {
				t.Fatalf("step %d of the reference: approval asked = %t, the rules say %t", i, ref.asked[i], s.needsApproval(i))
			}
		}
		checkLedger(t, -1, ref, want.Steps)
		total := refProc.appends
		// One store for the crash points, a run each: a new store per
		// crash point would cost more than the run.
		store, closeStore := stores.open(t, kind)
		defer closeStore()
		for crash := 0; crash < total; crash++ {
			crashDecided(t, s, store, fmt.Sprintf("p%d", crash), crash, resumeCrash, want)
		}
		countDecided(func() {
			decidedStats.runs++
			decidedStats.kinds[kind] += total
			for _, d := range ref.decisions {
				v := string(d.Verdict)
				if d.Arguments != nil {
					v += " (edited)"
				}
				decidedStats.verdicts[v]++
			}
		})
	})
	decidedStats.Lock()
	defer decidedStats.Unlock()
	t.Logf("%d generated runs, %d crash points resumed (%d crashed again while resuming; %d crashes fell on a decision's write); "+
		"verdicts per uncrashed run: %v; findings: %v; %d stopped resume_state_unknown; rows where a process began: %v; crash points by store: %v",
		decidedStats.runs, decidedStats.crashPoints, decidedStats.resumeCrashes, decidedStats.decideCrashes, decidedStats.verdicts,
		decidedStats.findings, decidedStats.unknown, decidedStats.rows, decidedStats.kinds)
	if stores.pg != nil && decidedStats.kinds["postgres"] == 0 {
		t.Errorf("no crash point ran on PostgreSQL")
	}
	for _, row := range []recovery.State{recovery.AwaitingApproval, recovery.Approved, recovery.Rejected, recovery.ActionUnknown,
		recovery.AwaitingResolution, recovery.Resolved} {
		if decidedStats.rows[row] == 0 {
			t.Errorf("no process began at the recovery row %s", row)
		}
	}
	for _, f := range []string{"resolve executed", "resolve not_executed", "await executed", "await not_executed"} {
		if decidedStats.findings[f] == 0 {
			t.Errorf("no finding %q was made", f)
		}
	}
	if decidedStats.decideCrashes == 0 {
		t.Errorf("no crash fell on a decision's write")
	}
}

// fewerChecks divides -rapid.checks by n for the rest of t. The
// package's tests run one after another, so no other test sees it.
func fewerChecks(t *testing.T, n int) {
	f := flag.Lookup("rapid.checks")
	before := f.Value.String()
	checks, err := strconv.Atoi(before)
	if err != nil {
		t.Fatalf("-rapid.checks=%s: %v", before, err)
	}
	if err := flag.Set("rapid.checks", strconv.Itoa(max(1, checks/n))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { flag.Set("rapid.checks", before) })
}

// crashDecided runs s as run runID on store in a process that dies after
// crash appends, then resumes it in one that dies after resumeCrash (-1:
// never) and in one that does not die, and checks the outcome against the
// uncrashed run's result want.
func crashDecided(t *rapid.T, s decidedScenario, store seams.RunStore, runID string, crash, resumeCrash int, want events.RunResult) {
	ctx := context.Background()
	w := newWorld(t, s, store, runID)
	if _, err := w.life(t, &process{inner: store, after: crash, dies: s.dies}, crash); !errors.Is(err, proptest.ErrCrashed) {
		t.Fatalf("crash %d: the run ended with %v", crash, err)
	}
	unknownExpected := false
	begin := func() {
		stream, err := store.Load(ctx, w.runID)
		if err != nil {
			t.Fatal(err)
		}
		v, err := recovery.Classify(w.runID, stream)
		if err != nil {
			t.Fatalf("crash %d left a corrupt log: %v", crash, err)
		}
		countDecided(func() { decidedStats.rows[v.State]++ })
		if in := v.InDoubt; in != nil && in.ReplayPolicy == events.ReplayNever &&
			(in.IntentKind == events.IntentModelCall || s.mode == "unknown" && v.State == recovery.ActionUnknown) {
			unknownExpected = true
		}
	}
	begin()
	if resumeCrash >= 0 {
		_, err := w.life(t, &process{inner: store, after: resumeCrash, dies: s.dies}, crash)
		switch {
		case err == nil || errors.Is(err, proptest.ErrCrashed):
			if err != nil {
				countDecided(func() { decidedStats.resumeCrashes++ })
			}
			begin()
		default:
			t.Fatalf("crash %d, then resume crashed after %d: %v", crash, resumeCrash, err)
		}
	}
	got, err := w.life(t, &process{inner: store, after: -1}, crash)
	if err != nil {
		t.Fatalf("crash %d: resume: %v", crash, err)
	}
	final, err := store.Load(ctx, w.runID)
	if err != nil {
		t.Fatal(err)
	}
	// The ledger first: it is the oracle that does not rest on the code
	// under test.
	checkLedger(t, crash, w, got.Steps)
	if err := recovery.Check(w.runID, final); err != nil {
		t.Fatalf("crash %d: final log corrupt: %v", crash, err)
	}
	checkDecisionsRecorded(t, crash, w, final)

	resolved := -1 // the first step an operator resolved
	for i := range w.resolvedAt {
		if resolved < 0 || i < resolved {
			resolved = i
		}
	}
	switch {
	case (got.StopReason == events.StopResumeStateUnknown) != unknownExpected:
		t.Fatalf("crash %d: stop %s, but a never side effect left in doubt unresolved = %t", crash, got.StopReason, unknownExpected)
	case unknownExpected:
		if !proptest.SameSteps(got.Steps, projections.Fold(final[:len(final)-1]).Trajectory()) {
			t.Fatalf("crash %d: resume_state_unknown changed the trajectory", crash)
		}
		countDecided(func() { decidedStats.unknown++ })
	case resolved >= 0:
		// Up to the first resolved step, the uncrashed run's; beyond it
		// too when every finding gave the model what the uncrashed run
		// observed (an honest "executed" of an action that did not fail),
		// the findings being marked synthetic.
		if len(got.Steps) <= resolved || !proptest.SameSteps(got.Steps[:resolved], want.Steps[:min(resolved, len(want.Steps))]) {
			t.Fatalf("crash %d: the trajectory before step %d, which an operator resolved, is not the uncrashed run's", crash, resolved)
		}
		same := true
		for i, v := range w.findings {
			if i >= len(got.Steps) || got.Steps[i].ActionStatus == nil || string(*got.Steps[i].ActionStatus) != string(v) ||
				!got.Steps[i].ObservationIsSynthetic {
				t.Fatalf("crash %d: step %d, which an operator found %s, is not completed so (a synthetic observation)", crash, i, v)
			}
			same = same && v == events.VerdictExecuted && !s.envFails[i]
		}
		if same {
			steps := append([]events.StepRecord(nil), got.Steps...)
			for i := range w.findings {
				steps[i].ObservationIsSynthetic = false
			}
			if got.StopReason != want.StopReason || !proptest.SameSteps(steps, want.Steps) {
				t.Fatalf("crash %d: resolved as the uncrashed run ran, the resumed run %s after %d steps, the uncrashed run %s after %d",
					crash, got.StopReason, len(got.Steps), want.StopReason, len(want.Steps))
			}
		}
	case got.StopReason != want.StopReason || !proptest.SameSteps(got.Steps, want.Steps) ||
		!reflect.DeepEqual(got.FinalAnswer, want.FinalAnswer):
		t.Fatalf("crash %d: resumed to %s after %d steps, the uncrashed run %s after %d",
			crash, got.StopReason, len(got.Steps), want.StopReason, len(want.Steps))
	}
	countDecided(func() { decidedStats.crashPoints++ })
}

// checkLedger holds the tools' ledger to the scenario: a never action ran
// at most once; an action that needs approval ran only once approved, and
// never when rejected; an edited one with the edited arguments; nothing
// ran again once resolved. steps is the final trajectory, whose edited
// steps must show the arguments that ran.
func checkLedger(t *rapid.T, crash int, w *world, steps []events.StepRecord) {
	w.mu.Lock()
	defer w.mu.Unlock()
	runs, calls := map[int]int{}, map[int]string{}
	for _, e := range w.executions {
		i := e.step
		runs[i]++
		if calls[i] == "" {
			calls[i] = e.call
		}
		c := w.s.calls[i]
		switch {
		case e.call != calls[i]:
			t.Fatalf("crash %d: step %d's action ran as call %s and as call %s", crash, i, calls[i], e.call)
		case c == nil:
			t.Fatalf("crash %d: step %d ran a tool, but its reply asks for none", crash, i)
		case runs[i] > 1 && c.Name != "count":
			t.Fatalf("crash %d: step %d's never action %s ran %d times", crash, i, c.Name, runs[i])
		case w.s.needsApproval(i) && w.s.verdicts[i] == "reject":
			t.Fatalf("crash %d: step %d's %s ran, though the reviewer rejected it", crash, i, c.Name)
		case w.s.needsApproval(i) && (w.approvedAt[i] == 0 || e.seq < w.approvedAt[i]):
			t.Fatalf("crash %d: step %d's %s ran before it was approved", crash, i, c.Name)
		case w.resolvedAt[i] != 0 && e.seq > w.resolvedAt[i]:
			t.Fatalf("crash %d: step %d's %s ran again after an operator resolved it", crash, i, c.Name)
		}
		if w.s.needsApproval(i) && w.s.verdicts[i] == "edit" {
			var args map[string]any
			json.Unmarshal([]byte(w.s.edited(i)), &args)
			if !reflect.DeepEqual(e.args, args) {
				t.Fatalf("crash %d: step %d ran with %v, the reviewer edited it to %v", crash, i, e.args, args)
			}
		}
	}
	for i, s := range steps {
		if i < len(w.s.calls) && w.s.needsApproval(i) && w.s.verdicts[i] == "edit" && w.approvedAt[i] != 0 {
			if s.ToolArguments == nil || *s.ToolArguments != w.s.edited(i) {
				t.Fatalf("crash %d: step %d's tool_arguments %v, not the edited arguments that ran", crash, i, s.ToolArguments)
			}
		}
	}
}

// checkDecisionsRecorded: the log holds exactly the decisions people made
// (each once, in order), and nothing else calls itself one.
func checkDecisionsRecorded(t *rapid.T, crash int, w *world, final []events.Envelope) {
	var logged []events.Decision
	for _, env := range final {
		if d, ok := env.Event.(events.Decision); ok {
			logged = append(logged, d)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !reflect.DeepEqual(logged, w.decisions) {
		t.Fatalf("crash %d: the log holds %d decisions, people made %d: %+v vs %+v", crash, len(logged), len(w.decisions), logged, w.decisions)
	}
}
