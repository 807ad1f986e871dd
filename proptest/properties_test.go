package proptest_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/internal/soak"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/projections"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// TestMain raises rapid's default to 100 generated runs per property, and
// to 1,000 under POLYLOOP_SOAK=1 (make soak, CI: package soak), so CI covers
// at least that many; make prop passes -rapid.checks=100000. Run as the
// real-crash test's child (see kill_test.go), it runs the agent instead.
func TestMain(m *testing.M) {
	if os.Getenv(childStoreEnv) != "" {
		os.Exit(runKillChild())
	}
	if os.Getenv(damageChildEnv) != "" {
		os.Exit(runDamageChild())
	}
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "rapid.checks" })
	if !set {
		flag.Set("rapid.checks", strconv.Itoa(soak.Count(100, 1000)))
	}
	os.Exit(pgtest.Main(m))
}

// scenario is a generated run: the model's turns by call index, the
// executor's behaviour by step, policies and budgets.
type scenario struct {
	turns       []seamstest.Turn
	outcomes    []string // per step: ok, complete, error
	modelPolicy events.ReplayPolicy
	budget      engine.Budget
	oneEvent    bool
}

// turnKinds is weighted towards turns that keep a run going, so runs are
// long enough to hold many crash points.
var turnKinds = []string{"safe-tool", "safe-tool", "safe-tool", "never-tool", "never-tool", "toolless", "toolless",
	"invalid-args", "unknown-tool", "garbage", "final", "model-error"}

func drawScenario(t *rapid.T) scenario {
	n := rapid.IntRange(1, 12).Draw(t, "turns")
	s := scenario{
		modelPolicy: rapid.SampledFrom([]events.ReplayPolicy{events.ReplaySafe, events.ReplayNever}).Draw(t, "model_policy"),
		oneEvent:    rapid.Bool().Draw(t, "one_event_per_transaction"),
		budget: engine.Budget{
			MaxSteps:                    rapid.IntRange(1, 12).Draw(t, "max_steps"),
			MaxActions:                  rapid.IntRange(1, 10).Draw(t, "max_actions"),
			MaxConsecutiveParseFailures: rapid.IntRange(1, 3).Draw(t, "max_parse_failures"),
			MaxPromptChars:              rapid.SampledFrom([]int{300, 1000, 100_000, 100_000}).Draw(t, "max_prompt_chars"),
		},
	}
	for i := range n {
		kind := rapid.SampledFrom(turnKinds).Draw(t, fmt.Sprint("turn_", i))
		var content string
		switch kind {
		case "safe-tool":
			content = fmt.Sprintf(`TOOL count {"dir":"d%d"}`, i)
		case "never-tool":
			content = fmt.Sprintf(`TOOL pay {"amount":%d}`, i)
		case "invalid-args":
			content = `TOOL pay {"amount":"lots"}`
		case "unknown-tool":
			content = `TOOL launch {}`
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
		s.outcomes = append(s.outcomes, rapid.SampledFrom([]string{"ok", "ok", "ok", "ok", "ok", "complete", "error"}).Draw(t, fmt.Sprint("outcome_", i)))
	}
	return s
}

var registry = func() *seams.Registry {
	r, err := seams.NewRegistry(
		seams.Tool{Spec: seams.ToolSpec{Name: "count", ReplayPolicy: events.ReplaySafe,
			Parameters: map[string]any{"type": "object", "required": []string{"dir"}}},
			Handler: func(context.Context, map[string]any) (string, error) { return "", nil }},
		seams.Tool{Spec: seams.ToolSpec{Name: "pay",
			Parameters: map[string]any{"type": "object", "required": []string{"amount"},
				"properties": map[string]any{"amount": map[string]any{"type": "integer"}}}},
			Handler: func(context.Context, map[string]any) (string, error) { return "", nil }},
	)
	if err != nil {
		panic(err)
	}
	return r
}()

// agent is one process's view of a scenario: fresh model and executor
// doubles (which count calls) on a store.
type agent struct {
	model *seamstest.Model
	exec  *seamstest.Executor
	def   engine.Definition
	req   engine.Request
}

func (s scenario) agent(store seams.RunStore, model *seamstest.Model, exec *seamstest.Executor) agent {
	if model == nil {
		model = &seamstest.Model{Turns: s.turns}
	}
	if exec == nil {
		exec = &seamstest.Executor{Respond: func(_ context.Context, c seams.ActionCall) (events.ActionOutcome, error) {
			switch s.outcomes[c.StepIdx] {
			case "complete":
				return events.ActionOutcome{Status: events.StatusExecuted, Observation: "done", EnvReportedCompletion: true}, nil
			case "error":
				return events.ActionOutcome{}, errors.New("sandbox lost")
			}
			return events.ActionOutcome{Status: events.StatusExecuted, Observation: fmt.Sprintf("ran %q", c.Action.Text)}, nil
		}}
	}
	return agent{model: model, exec: exec,
		def: engine.Definition{Model: model, Parser: seamstest.Parser{}, Store: store},
		req: engine.Request{RunID: "p", Budget: s.budget, Executor: exec, Tools: registry,
			ModelReplayPolicy: s.modelPolicy, OneEventPerTransaction: s.oneEvent,
			Context: engine.Context{GoalLevel: []seams.Message{seams.Text(seams.RoleUser, "goal")}}}}
}

// crashStats counts what the crash property exercised, for the closing
// note; logged once per test.
var crashStats struct {
	sync.Mutex
	runs, crashPoints, unknown, resumeCrashes, cancelled int
	rows                                                 map[recovery.State]int
	kinds                                                map[string]int // crash points per store kind
}

// TestPropertyCrashAtEveryWrite: for generated runs, on MemStore and kv,
// crash at every transaction (every event in one-event mode), then Resume —
// itself crashed at a drawn write and resumed again, and cancelled at a
// drawn side effect. The final trajectory equals the uncrashed run's
// wherever policies allow continuing (a cancelled run's is a prefix of it);
// no never side effect runs twice; every action executed has its outcome in
// the log; resume_state_unknown happens exactly when a crash fell between a
// never intent and its result. Every row of the recovery table must be
// reached.
func TestPropertyCrashAtEveryWrite(t *testing.T) {
	ctx := context.Background()
	stores := newStoreFactory(t)
	crashStats.rows, crashStats.kinds = map[recovery.State]int{}, map[string]int{}
	rapid.Check(t, func(t *rapid.T) {
		s := drawScenario(t)
		kind := rapid.SampledFrom(stores.kinds("memory", "memory", "memory", "kv")).Draw(t, "store")
		resumeCrash := rapid.SampledFrom([]int{-1, -1, 0, 1, 2, 3, 5}).Draw(t, "resume_crash_after")
		cancelAt := rapid.SampledFrom([]int{-1, -1, -1, 0, 1, 2, 4}).Draw(t, "cancel_at_side_effect")
		refStore := &seamstest.MemStore{}
		ref := s.agent(refStore, nil, nil)
		want, err := engine.Run(ctx, ref.def, ref.req)
		if err != nil {
			t.Fatalf("reference run: %v", err)
		}
		if want.StopReason == events.StopResumeStateUnknown || want.StopReason == events.StopCancelled {
			t.Fatalf("reference stopped with %s", want.StopReason)
		}
		total := int(refStore.Transactions())
		for crash := 0; crash < total; crash++ {
			store, closeStore := stores.open(t, kind)
			crashResumeCancel(t, s, store, crash, resumeCrash, cancelAt, want)
			closeStore()
		}
		crashStats.Lock()
		crashStats.kinds[kind] += total
		crashStats.Unlock()
		crashStats.Lock()
		crashStats.runs++
		crashStats.Unlock()
	})
	crashStats.Lock()
	defer crashStats.Unlock()
	t.Logf("%d generated runs, %d crash points resumed (%d of them crashed again while resuming, %d cancelled), %d stopped as resume_state_unknown; rows reached: %v; crash points by store: %v",
		crashStats.runs, crashStats.crashPoints, crashStats.resumeCrashes, crashStats.cancelled, crashStats.unknown, crashStats.rows, crashStats.kinds)
	if stores.pg != nil && crashStats.kinds["postgres"] == 0 {
		t.Errorf("no crash point ran on PostgreSQL")
	}
	for _, row := range []recovery.State{recovery.BetweenSteps, recovery.ModelCallUnknown, recovery.KnownFailure,
		recovery.ReplyStored, recovery.ActionUnknown} {
		if crashStats.rows[row] == 0 {
			t.Errorf("no crash reached the recovery row %s", row)
		}
	}
}

// crashResumeCancel runs s on store, crashing after crash appends; resumes
// it, crashing that resume after resumeCrash appends (-1: never) and resuming
// again; the last resume is cancelled at side effect cancelAt (-1: never).
// It checks the outcome against the uncrashed run's result want.
func crashResumeCancel(t *rapid.T, s scenario, store seams.RunStore, crash, resumeCrash, cancelAt int, want events.RunResult) {
	ctx := context.Background()
	a := s.agent(&proptest.CrashingStore{Inner: store, After: crash}, nil, nil)
	if _, err := engine.Run(ctx, a.def, a.req); !errors.Is(err, proptest.ErrCrashed) {
		t.Fatalf("crash %d: run ended with %v", crash, err)
	}
	classify := func() recovery.Verdict {
		durable, err := store.Load(ctx, "p")
		if err != nil {
			t.Fatal(err)
		}
		verdict, err := recovery.Classify("p", durable)
		if err != nil {
			t.Fatalf("crash %d left a corrupt log: %v", crash, err)
		}
		crashStats.Lock()
		crashStats.rows[verdict.State]++
		crashStats.Unlock()
		return verdict
	}
	verdict := classify()
	inDoubtNever := verdict.InDoubt != nil && verdict.InDoubt.ReplayPolicy == events.ReplayNever

	// The next process: same scripts, same counters. It may crash too.
	resume := func(store seams.RunStore, cctx context.Context) (events.RunResult, error) {
		b := s.agent(store, a.model, a.exec)
		if verdict.State == recovery.Empty {
			if _, err := engine.Resume(ctx, b.def, b.req); !errors.Is(err, engine.ErrRunNotFound) {
				t.Fatalf("crash %d: resume of an empty log: %v", crash, err)
			}
			return engine.Run(cctx, b.def, b.req)
		}
		return engine.Resume(cctx, b.def, b.req)
	}
	if resumeCrash >= 0 {
		_, err := resume(&proptest.CrashingStore{Inner: store, After: resumeCrash}, ctx)
		switch {
		case err == nil: // the resumed run finished before its crash point
			verdict = classify()
		case errors.Is(err, proptest.ErrCrashed):
			crashStats.Lock()
			crashStats.resumeCrashes++
			crashStats.Unlock()
			verdict = classify()
			inDoubtNever = inDoubtNever || verdict.InDoubt != nil && verdict.InDoubt.ReplayPolicy == events.ReplayNever
		default:
			t.Fatalf("crash %d, then resume crashed after %d: %v", crash, resumeCrash, err)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sideEffects := 0
	onSideEffect := func() {
		if sideEffects == cancelAt {
			cancel()
		}
		sideEffects++
	}
	a.model.OnCall = func(seams.ModelCall) { onSideEffect() }
	respond := a.exec.Respond
	interrupted := map[string]bool{} // actions that failed after cancellation
	a.exec.Respond = func(c context.Context, call seams.ActionCall) (events.ActionOutcome, error) {
		onSideEffect()
		out, err := respond(c, call)
		if err != nil && cctx.Err() != nil {
			interrupted[call.ResultID] = true
		}
		return out, err
	}
	got, err := resume(store, cctx)
	a.model.OnCall, a.exec.Respond = nil, respond
	if err != nil {
		t.Fatalf("crash %d: resume: %v", crash, err)
	}
	final, _ := store.Load(ctx, "p")
	if err := recovery.Check("p", final); err != nil {
		t.Fatalf("crash %d: final log corrupt: %v", crash, err)
	}
	checkOutcomesRecorded(t, crash, final, a, interrupted)
	checkNeverOnce(t, crash, final, a)
	cancelled := got.StopReason == events.StopCancelled
	switch {
	case cancelled && cancelAt < 0:
		t.Fatalf("crash %d: cancelled without a cancellation", crash)
	case cancelled:
		n := len(got.Steps)
		if n > len(want.Steps) || !proptest.SameSteps(got.Steps, want.Steps[:n]) {
			t.Fatalf("crash %d: a cancelled resume's %d steps are not a prefix of the uncrashed run's", crash, n)
		}
	case (got.StopReason == events.StopResumeStateUnknown) != inDoubtNever:
		t.Fatalf("crash %d: stop %s, but never side effect in doubt = %v (state %s)", crash, got.StopReason, inDoubtNever, verdict.State)
	case inDoubtNever:
		if !proptest.SameSteps(got.Steps, projections.Fold(final[:len(final)-1]).Trajectory()) {
			t.Fatalf("crash %d: resume_state_unknown changed the trajectory", crash)
		}
	case got.StopReason != want.StopReason || !proptest.SameSteps(got.Steps, want.Steps) ||
		!reflect.DeepEqual(got.FinalAnswer, want.FinalAnswer):
		t.Fatalf("crash %d (state %s): resumed to %s after %d steps, uncrashed run %s after %d",
			crash, verdict.State, got.StopReason, len(got.Steps), want.StopReason, len(want.Steps))
	}
	crashStats.Lock()
	crashStats.crashPoints++
	if inDoubtNever && !cancelled {
		crashStats.unknown++
	}
	if cancelled {
		crashStats.cancelled++
	}
	crashStats.Unlock()
}

// checkOutcomesRecorded: every action executed (by any process) has its
// outcome in the log under its result id — except the last action of a run
// that stopped resume_state_unknown (a crash left it in doubt) or cancelled
// while the executor failed (it was interrupted: its intent stays
// unanswered, see engine's doc).
func checkOutcomesRecorded(t *rapid.T, crash int, final []events.Envelope, a agent, interrupted map[string]bool) {
	recorded := map[string]bool{}
	lastIntent := ""
	for _, env := range final {
		switch ev := env.Event.(type) {
		case events.StepCompleted:
			recorded[ev.ResultID] = true
		case events.Intent:
			lastIntent = ev.ResultID
		}
	}
	r, _ := projections.Fold(final).Result()
	for _, c := range a.exec.Calls() {
		excused := c.ResultID == lastIntent && (r.StopReason == events.StopResumeStateUnknown ||
			r.StopReason == events.StopCancelled && interrupted[c.ResultID])
		if !recorded[c.ResultID] && !excused {
			t.Fatalf("crash %d: action %s was executed but its outcome is not in the log (run stopped %s)", crash, c.ResultID, r.StopReason)
		}
	}
}

// checkNeverOnce: a model call or action whose intent says never was
// performed at most once across both processes.
func checkNeverOnce(t *rapid.T, crash int, final []events.Envelope, a agent) {
	policy := map[string]events.ReplayPolicy{}
	for _, in := range projections.Fold(final).Intents {
		policy[in.ResultID] = in.ReplayPolicy
	}
	calls := map[string]int{}
	for _, c := range a.model.Calls() {
		calls[c.ResultID]++
	}
	for id, n := range calls {
		if n > 1 && policy[id] != events.ReplaySafe {
			t.Fatalf("crash %d: model call %s (policy %q) made %d times", crash, id, policy[id], n)
		}
	}
	for _, c := range a.exec.Calls() {
		if n := a.exec.Executions(c.ResultID); n > 1 && policy[c.ResultID] != events.ReplaySafe {
			t.Fatalf("crash %d: action %s (policy %q) executed %d times", crash, c.ResultID, policy[c.ResultID], n)
		}
	}
}

// logStore holds an arbitrary (possibly damaged) log and appends after it
// by the store rules.
type logStore struct {
	mu  sync.Mutex
	log []events.Envelope
	ids events.IDSource
}

func (l *logStore) Append(_ context.Context, runID string, after ulid.ULID, evs ...events.Event) ([]events.Envelope, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var tail ulid.ULID
	finished := false
	if len(l.log) > 0 {
		last := l.log[len(l.log)-1]
		tail, finished = last.ID, last.Kind == events.KindRunFinished
	}
	if err := seams.CheckAppend(runID, tail, finished, after, evs); err != nil {
		return nil, err
	}
	var out []events.Envelope
	for _, ev := range evs {
		tail = l.ids.NextAfter(time.Now(), tail)
		env := events.Envelope{ID: tail, Kind: ev.Kind(), SchemaVersion: events.CurrentSchemaVersion, Event: ev}
		l.log = append(l.log, env)
		out = append(out, env)
	}
	return out, nil
}

func (l *logStore) Load(context.Context, string) ([]events.Envelope, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]events.Envelope(nil), l.log...), nil
}

func (l *logStore) Parameters() map[string]string { return (&seamstest.MemStore{}).Parameters() }

// damage applies one random change to a log's events and names it. The
// name is the oracle: damage whose kind no crash and no sound run can
// produce must be refused, whatever recovery's code says — so a recovery
// that turned lenient fails here.
func damage(t *rapid.T, log []events.Event) (out []events.Event, label string, alwaysCorrupt bool) {
	out = append([]events.Event(nil), log...)
	i := rapid.IntRange(0, len(out)-1).Draw(t, "victim")
	switch op := rapid.SampledFrom([]string{"drop", "duplicate", "swap", "alter"}).Draw(t, "damage"); op {
	case "drop":
		out = append(out[:i], out[i+1:]...)
		return out, "drop " + string(log[i].Kind()), false // dropping the tail leaves a shorter sound log
	case "duplicate":
		// Every record is unique in a sound log: a second run_started or
		// run_finished, an intent or result repeated, a step repeated.
		return append(out[:i+1], out[i:]...), "duplicate " + string(log[i].Kind()), true
	case "swap":
		j := rapid.IntRange(0, len(out)-1).Draw(t, "other")
		out[i], out[j] = out[j], out[i]
		return out, "swap", false
	}
	ev, label, always := alter(t, out[i], answered(log, i))
	out[i] = ev
	return out, label, always
}

// answered reports whether the intent at log[i] has its result later in
// the log (so changing its result id orphans that result).
func answered(log []events.Event, i int) bool {
	in, ok := log[i].(events.Intent)
	if !ok {
		return false
	}
	for _, ev := range log[i+1:] {
		switch e := ev.(type) {
		case events.ModelCallResult:
			if e.ResultID == in.ResultID {
				return true
			}
		case events.StepCompleted:
			if e.ResultID == in.ResultID {
				return true
			}
		}
	}
	return false
}

func alter(t *rapid.T, ev events.Event, answered bool) (events.Event, string, bool) {
	switch e := ev.(type) {
	case events.Intent:
		switch rapid.IntRange(0, 3).Draw(t, "intent_field") {
		case 0:
			e.CallIndex += rapid.SampledFrom([]int{-1, 1, 5}).Draw(t, "delta")
			return e, "intent call_index changed", true
		case 1:
			e.ResultID += "x"
			return e, "intent result_id changed", answered
		case 2:
			if e.IntentKind == events.IntentAction {
				e.IntentKind = events.IntentModelCall
			} else {
				e.IntentKind = events.IntentAction
			}
			return e, "intent kind changed", true
		}
		if e.ReplayPolicy == events.ReplaySafe {
			e.ReplayPolicy = events.ReplayNever
		} else {
			e.ReplayPolicy = events.ReplaySafe
		}
		return e, "intent replay_policy changed", false // only the checksum sees it
	case events.ModelCallResult:
		if rapid.Bool().Draw(t, "swap_outcome") {
			if e.Reply != nil {
				f := "made up"
				e.Reply, e.Failure = nil, &f
			} else {
				e.Reply, e.Failure = &events.ModelReply{Content: "FINAL: invented"}, nil
			}
			return e, "model result reply/failure swapped", false
		}
		e.ResultID += "x"
		return e, "model result result_id changed", true
	case events.StepCompleted:
		switch rapid.IntRange(0, 3).Draw(t, "step_field") {
		case 0:
			e.Step.StepIdx += rapid.SampledFrom([]int{-1, 1, 3}).Draw(t, "delta")
			return e, "step index changed", true
		case 1:
			if e.ResultID == "" {
				e.ResultID = "invented"
				return e, "step result_id invented", true
			}
			e.ResultID += "x"
			return e, "step result_id changed", true
		case 2:
			if e.ResultID != "" {
				e.ResultID = ""
				return e, "step result_id removed", true
			}
		case 3:
			if e.ResultID != "" {
				e.ActionOutcome = nil
				return e, "a closed action intent's outcome removed", true
			}
		}
		return e, "nothing", false
	case events.RunFinished:
		e.Result.StopReason = events.StopTaskCompleted
		return e, "stop reason changed", false
	case events.RunStarted:
		e.RunID += "x"
		return e, "run_started run_id changed", true
	}
	return ev, "nothing", false
}

// TestPropertyDamagedLogsAreRefusedOrResumedSoundly: random damage to a
// sound log (finished or crashed) — an event dropped, duplicated, swapped
// or altered, or two keys out of order — is refused by recovery, or, where
// the damaged log is still sound, resumed to a sound finished log that
// extends it. Damage of a kind no sound log can hold must be refused: the
// generator says which, not recovery. Never a panic.
func TestPropertyDamagedLogsAreRefusedOrResumedSoundly(t *testing.T) {
	ctx := context.Background()
	var refused, resumed int
	kinds := map[string]int{}
	rapid.Check(t, func(t *rapid.T) {
		s := drawScenario(t)
		mem := &seamstest.MemStore{}
		crashAfter := rapid.IntRange(-1, 12).Draw(t, "crash_after")
		a := s.agent(&proptest.CrashingStore{Inner: mem, After: crashAfter}, nil, nil)
		engine.Run(ctx, a.def, a.req)
		stream, _ := mem.Load(ctx, "p")
		if len(stream) == 0 {
			return
		}
		var evs []events.Event
		for _, env := range stream {
			evs = append(evs, env.Event)
		}
		store := &logStore{}
		t0 := stream[0].Time()
		var damaged []events.Event
		var label string
		var always bool
		if len(stream) > 1 && rapid.IntRange(0, 5).Draw(t, "keys") == 0 {
			// The events stay; two of their keys trade places.
			damaged, label, always = evs, "keys out of order", true
			for _, ev := range damaged {
				store.log = append(store.log, events.Envelope{ID: store.ids.Next(t0), Kind: ev.Kind(), SchemaVersion: events.CurrentSchemaVersion, Event: ev})
			}
			i := rapid.IntRange(0, len(store.log)-2).Draw(t, "key_i")
			j := rapid.IntRange(i+1, len(store.log)-1).Draw(t, "key_j")
			store.log[i].ID, store.log[j].ID = store.log[j].ID, store.log[i].ID
		} else {
			damaged, label, always = damage(t, evs)
			for _, ev := range damaged {
				store.log = append(store.log, events.Envelope{ID: store.ids.Next(t0), Kind: ev.Kind(), SchemaVersion: events.CurrentSchemaVersion, Event: ev})
			}
		}
		kinds[label]++
		before := len(store.log)
		if err := recovery.Check("p", store.log); err != nil {
			if !errors.Is(err, recovery.ErrCorrupt) {
				t.Fatalf("refusal is not a CorruptError: %v", err)
			}
			b := s.agent(store, nil, nil)
			if _, err := engine.Resume(ctx, b.def, b.req); err == nil {
				t.Fatal("Resume accepted a log recovery refuses")
			}
			if len(store.log) != before {
				t.Fatal("a refused Resume wrote")
			}
			refused++
			return
		}
		if always {
			t.Fatalf("damage %q, which no sound log can hold, was accepted", label)
		}
		b := s.agent(store, nil, nil)
		_, err := engine.Resume(ctx, b.def, b.req)
		if err != nil && !errors.Is(err, engine.ErrParametersChanged) && !errors.Is(err, engine.ErrRunNotFound) {
			t.Fatalf("Resume of a sound damaged log: %v", err)
		}
		if err == nil {
			if err := recovery.Check("p", store.log); err != nil {
				t.Fatalf("Resume left a corrupt log: %v", err)
			}
			if l := projections.Fold(store.log); l.Finished == nil {
				t.Fatal("Resume returned but the run is not finished")
			}
			for i := range before {
				if !reflect.DeepEqual(store.log[i].Event, damaged[i]) {
					t.Fatal("Resume rewrote the existing log")
				}
			}
		}
		resumed++
	})
	t.Logf("damaged logs: %d refused, %d still sound and resumed; damage drawn: %v", refused, resumed, kinds)
}

// TestPropertyDamagedBytesAreAlwaysRefused: one bit flipped anywhere in
// any stored value of a sound log (finished or crashed) is refused: the
// load reports the damage, recovery lists it, Resume refuses and writes
// nothing.
func TestPropertyDamagedBytesAreAlwaysRefused(t *testing.T) {
	ctx := context.Background()
	rapid.Check(t, func(t *rapid.T) {
		s := drawScenario(t)
		mem := &seamstest.MemStore{}
		a := s.agent(&proptest.CrashingStore{Inner: mem, After: rapid.IntRange(-1, 12).Draw(t, "crash_after")}, nil, nil)
		engine.Run(ctx, a.def, a.req)
		stream, _ := mem.Load(ctx, "p")
		if len(stream) == 0 {
			return
		}
		raw := &rawStore{}
		for _, env := range stream {
			b, err := events.Marshal(env.Event)
			if err != nil {
				t.Fatal(err)
			}
			if err := events.Seal(b, "p", env.ID); err != nil {
				t.Fatal(err)
			}
			raw.ids, raw.vals = append(raw.ids, env.ID), append(raw.vals, b)
		}
		v := rapid.IntRange(0, len(raw.vals)-1).Draw(t, "value")
		bit := rapid.IntRange(0, 8*len(raw.vals[v])-1).Draw(t, "bit")
		raw.vals[v][bit/8] ^= 1 << (bit % 8)

		loaded, err := raw.Load(ctx, "p")
		var damage *events.DamageError
		if !errors.As(err, &damage) {
			t.Fatalf("bit %d of value %d flipped: Load returned %v", bit, v, err)
		}
		if _, err := recovery.ClassifyLoaded("p", loaded, err); !errors.Is(err, recovery.ErrCorrupt) {
			t.Fatalf("recovery accepted a damaged value: %v", err)
		}
		b := s.agent(raw, nil, nil)
		if _, err := engine.Resume(ctx, b.def, b.req); !errors.Is(err, recovery.ErrCorrupt) {
			t.Fatalf("Resume of a damaged value: %v", err)
		}
		if raw.appends > 0 {
			t.Fatal("a refused Resume wrote")
		}
	})
}

// rawStore holds a run's stored values as bytes and decodes them on Load,
// as a store does; it refuses appends (counting them).
type rawStore struct {
	ids     []ulid.ULID
	vals    [][]byte
	appends int
}

func (r *rawStore) Append(context.Context, string, ulid.ULID, ...events.Event) ([]events.Envelope, error) {
	r.appends++
	return nil, errors.New("rawStore: read-only")
}

func (r *rawStore) Load(_ context.Context, runID string) ([]events.Envelope, error) {
	sr := events.StreamReader{RunID: runID}
	for i, v := range r.vals {
		sr.Value(r.ids[i], v)
	}
	return sr.Stream()
}

func (r *rawStore) Parameters() map[string]string { return (&seamstest.MemStore{}).Parameters() }
