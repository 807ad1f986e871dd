package proptest_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/oklog/ulid/v2"
	"pgregory.net/rapid"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// forkingKinds is the store kinds the fork properties draw from: MemStore
// memory times over (a run costs about 5 times more on kv and 35 times
// more on PostgreSQL, and the properties' time is CI's), then kv and
// PostgreSQL once they fork runs (seams.RunForker) — rapid draws the last
// of a list more often than the rest. A store that does not fork yet is
// left out, and the test's log says so.
func forkingKinds(t *testing.T, stores *storeFactory, memory int) []string {
	kinds := slices.Repeat([]string{"memory"}, memory)
	for _, c := range []struct {
		kind  string
		store any
		here  bool
	}{
		{"kv", (*kv.Store)(nil), true},
		{"postgres", stores.pg, stores.pg != nil}, // newStoreFactory said why not
	} {
		if !c.here {
			continue
		}
		if _, ok := c.store.(seams.RunForker); !ok {
			t.Logf("%s left out: %T does not implement seams.RunForker yet, so its forks are not checked", c.kind, c.store)
			continue
		}
		kinds = append(kinds, c.kind)
	}
	return kinds
}

// drawForkScenario is drawScenario, half the time made to go on longer —
// more turns that keep a run going (safe, never and tool-less actions),
// budgets of 12 steps and actions, no prompt budget — so that forks have
// long prefixes to copy and forks of forks have prefixes of prefixes.
func drawForkScenario(t *rapid.T) scenario {
	s := drawScenario(t)
	if !rapid.Bool().Draw(t, "longer") {
		return s
	}
	for i := len(s.turns); i < 12; i++ {
		var content string
		switch rapid.SampledFrom([]string{"safe-tool", "never-tool", "toolless"}).Draw(t, fmt.Sprint("turn_", i)) {
		case "safe-tool":
			content = fmt.Sprintf(`TOOL count {"dir":"d%d"}`, i)
		case "never-tool":
			content = fmt.Sprintf(`TOOL pay {"amount":%d}`, i)
		default:
			content = fmt.Sprintf("ACTION: step %d", i)
		}
		s.turns = append(s.turns, seamstest.Turn{Reply: events.ModelReply{CallID: fmt.Sprintf("call-%d", i), Content: content}})
		s.outcomes = append(s.outcomes, rapid.SampledFrom([]string{"ok", "ok", "ok", "error"}).Draw(t, fmt.Sprint("outcome_", i)))
	}
	s.budget.MaxSteps, s.budget.MaxActions, s.budget.MaxPromptChars = 12, 12, 100_000
	return s
}

// checkCovered fails t when a store kind of kinds was never drawn — under
// the race detector, whose fewer checks may miss a rarely drawn store by
// chance, it only says so.
func checkCovered(t *testing.T, kinds []string, drawn map[string]int) {
	for _, kind := range kinds {
		switch {
		case drawn[kind] > 0:
		case raceDetector:
			t.Logf("%s was not drawn in this run's fewer checks", kind)
		default:
			t.Errorf("%s was never drawn", kind)
		}
	}
}

// toolLedger is the tools' side of a run (or of the processes of one
// run): every action the executor is handed, written down before it
// runs. Each is attributed to the turn of the script whose reply asked
// for it by the action's own text — safe, never and tool-less actions
// name their turn — not by anything the engine says about it, so the
// ledger can be the oracle of what ran. Outcomes are the scenario's, by
// turn.
type toolLedger struct {
	script   []seamstest.Turn
	outcomes []string

	mu     sync.Mutex
	turns  []int           // the turn of each execution, in order
	ids    map[string]int  // result id → executions
	safe   map[int]bool    // turns whose action is the safe tool's
	safeID map[string]bool // result ids of the safe tool's actions
}

func newToolLedger(script []seamstest.Turn, outcomes []string) *toolLedger {
	return &toolLedger{script: script, outcomes: outcomes, ids: map[string]int{}, safe: map[int]bool{}, safeID: map[string]bool{}}
}

// turnOf is the one turn of the script whose reply is the action a, or
// -1 when none or several are.
func (l *toolLedger) turnOf(a seams.Action) int {
	turn := -1
	for i, tr := range l.script {
		c := strings.TrimSpace(tr.Reply.Content)
		if tr.Err == nil && (c == a.Text || c == "ACTION: "+a.Text) {
			if turn >= 0 {
				return -1
			}
			turn = i
		}
	}
	return turn
}

// Execute implements seams.ActionExecutor.
func (l *toolLedger) Execute(_ context.Context, call seams.ActionCall) (events.ActionOutcome, error) {
	turn := l.turnOf(call.Action)
	l.mu.Lock()
	l.turns = append(l.turns, turn)
	l.ids[call.ResultID]++
	safe := call.Action.ToolCall != nil && call.Action.ToolCall.Name == "count"
	l.safe[turn], l.safeID[call.ResultID] = safe, safe
	l.mu.Unlock()
	if turn < 0 {
		return events.ActionOutcome{}, fmt.Errorf("no turn of the script asked for %q", call.Action.Text)
	}
	switch l.outcomes[turn] {
	case "complete":
		return events.ActionOutcome{Status: events.StatusExecuted, Observation: "done", EnvReportedCompletion: true}, nil
	case "error":
		return events.ActionOutcome{}, errors.New("sandbox lost")
	}
	return events.ActionOutcome{Status: events.StatusExecuted, Observation: fmt.Sprintf("ran %q", call.Action.Text)}, nil
}

// Parameters implements seams.ActionExecutor.
func (l *toolLedger) Parameters() map[string]string { return map[string]string{"kind": "ledger"} }

// ran counts the executions of each turn.
func (l *toolLedger) ran() map[int]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[int]int{}
	for _, turn := range l.turns {
		out[turn]++
	}
	return out
}

// from is ran restricted to the turns k and later.
func from(ran map[int]int, k int) map[int]int {
	out := maps.Clone(ran)
	maps.DeleteFunc(out, func(turn, _ int) bool { return turn < k })
	return out
}

// checkRanOnlyFrom holds a fork at k to its ledger: nothing attributed to
// no turn, nothing of the copied steps (turns before k), no never action
// twice (by turn and by result id).
func checkRanOnlyFrom(t *rapid.T, what string, l *toolLedger, k int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	runs := map[int]int{}
	for _, turn := range l.turns {
		runs[turn]++
		switch {
		case turn < 0:
			t.Fatalf("%s ran an action no reply of its script asked for", what)
		case turn < k:
			t.Fatalf("%s ran the action of turn %d, a step it copied (it forked at %d)", what, turn, k)
		case runs[turn] > 1 && !l.safe[turn]:
			t.Fatalf("%s ran the never action of turn %d %d times", what, turn, runs[turn])
		}
	}
	for id, n := range l.ids {
		if n > 1 && !l.safeID[id] {
			t.Fatalf("%s ran the never action %s %d times", what, id, n)
		}
	}
}

// forker is one process's handle on a run that is, or will be, a fork:
// a model scripted by call index and the tools' ledger, on a store.
type forker struct {
	model *seamstest.Model
	tools *toolLedger
	def   engine.Definition
	req   engine.Request
}

// on builds the definition and request of run runID of s on store, fed
// script (and the outcomes by turn), with the tools' ledger given or a
// new one.
func (s scenario) on(store seams.RunStore, runID string, script []seamstest.Turn, outcomes []string, tools *toolLedger) forker {
	if tools == nil {
		tools = newToolLedger(script, outcomes)
	}
	a := s.agent(store, &seamstest.Model{Turns: script}, nil)
	a.req.RunID, a.req.Executor = runID, tools
	return forker{model: a.model, tools: tools, def: a.def, req: a.req}
}

// splice is the script a fork fed other replies after k follows: the
// source's turns before k (they were the source's), other's from k, each
// at its call index. A source whose script ends before k stopped when it
// ran out (llm_error), so nothing after that can be reached: its script
// is the fork's too.
func splice[T any](source, other []T, k int) []T {
	if k > len(source) {
		return source
	}
	out := slices.Clone(source[:k])
	if k < len(other) {
		out = append(out, other[k:]...)
	}
	return out
}

// stored is runID's log and its result, which must be sound and finished,
// and equal to the result the driver returned.
func stored(t *rapid.T, store seams.RunStore, runID string, returned events.RunResult) []events.Envelope {
	stream, err := store.Load(context.Background(), runID)
	if err != nil {
		t.Fatalf("load %s: %v", runID, err)
	}
	v, err := recovery.Classify(runID, stream)
	if err != nil {
		t.Fatalf("%s's log is not sound: %v", runID, err)
	}
	if v.Result == nil {
		t.Fatalf("%s returned, but its log is not finished (%s)", runID, v.State)
	}
	if !sameResult(*v.Result, returned) {
		t.Fatalf("%s returned %s after %d steps; its log holds %s after %d", runID, returned.StopReason, len(returned.Steps), v.Result.StopReason, len(v.Result.Steps))
	}
	return stream
}

// sameResult: the same stop, answer and trajectory, timing aside.
func sameResult(a, b events.RunResult) bool {
	return a.StopReason == b.StopReason && reflect.DeepEqual(a.FinalAnswer, b.FinalAnswer) && proptest.SameSteps(a.Steps, b.Steps)
}

// callsFrom counts a model's calls by call index, those before k apart.
func callsFrom(m *seamstest.Model, k int) (before int, after map[int]int) {
	after = map[int]int{}
	for _, c := range m.Calls() {
		if c.CallIndex < k {
			before++
		} else {
			after[c.CallIndex]++
		}
	}
	return before, after
}

// forkStats counts what the fork properties exercised, for their closing
// notes.
var forkStats struct {
	sync.Mutex
	runs, forks, forksOfForks, diverged map[string]int // by store kind
	steps                               map[int]int    // generated runs by their steps
	live                                map[string]int // racing forks taken while the source ran, by store kind
	midStep                             int            // of them, with a step in flight
	crashPoints, notCopied, unknown     int
}

func countFork(f func()) {
	forkStats.Lock()
	defer forkStats.Unlock()
	f()
}

// TestPropertyAForkRetracesItsSource: for a generated finished run (safe
// and never actions, tool-less ones, parse failures, model failures, a
// final answer or a budget stop), a fork at every step k fed the same
// replies (the script is by call index) ends as the source did, with the
// same trajectory, making only the model calls of steps k and later and
// running only their actions — each once, as the tools' ledger shows, not
// the engine. Fed other replies from k, a fork has the source's first k
// steps and then the trajectory of a run fed those replies from the
// start, running only the actions of turns k and later. Forks of a fork,
// at every step of it: the same. Every fork's log is sound and holds its
// parent's first k steps as the parent holds them, then its own events
// only. On MemStore, kv and PostgreSQL (each when it forks runs; there,
// to spare CI's time, other replies and forks of a fork at drawn steps
// only).
//
// Each check forks at every step, so it generates half of -rapid.checks,
// and a tenth under the race detector, which slows it several times.
func TestPropertyAForkRetracesItsSource(t *testing.T) {
	fewerChecks(t, 2)
	if raceDetector {
		fewerChecks(t, 5)
	}
	ctx := context.Background()
	stores := newStoreFactory(t)
	kinds := forkingKinds(t, stores, 14)
	forkStats.runs, forkStats.forks, forkStats.forksOfForks, forkStats.diverged = map[string]int{}, map[string]int{}, map[string]int{}, map[string]int{}
	forkStats.steps = map[int]int{}
	rapid.Check(t, func(t *rapid.T) {
		s := drawForkScenario(t)
		other := drawForkScenario(t) // only its turns and outcomes are used
		kind := rapid.SampledFrom(kinds).Draw(t, "store")
		store, closeStore := stores.open(t, kind)
		defer closeStore()

		src := s.on(store, "src", s.turns, s.outcomes, nil)
		want, err := engine.Run(ctx, src.def, src.req)
		if err != nil {
			t.Fatalf("source run: %v", err)
		}
		// logs: the finished logs of the source and its forks under the
		// same replies, each read once, to hold their forks to.
		logs := map[string][]events.Envelope{"src": stored(t, store, "src", want)}
		finished := func(runID string) []events.Envelope {
			if logs[runID] == nil {
				logs[runID] = stored(t, store, runID, want)
			}
			return logs[runID]
		}
		checkRanOnlyFrom(t, "the source", src.tools, 0)
		srcRan := src.tools.ran()
		n := len(want.Steps)

		// retraces forks the run parent at k under the source's replies
		// and holds the fork to the source. A parent is the source or a
		// fork of it under the same replies: its result is want.
		retraces := func(parent, runID string, k int) {
			f := s.on(store, runID, s.turns, s.outcomes, nil)
			got, err := engine.Fork(ctx, f.def, f.req, parent, k)
			if err != nil {
				t.Fatalf("fork %s of %s at %d: %v", runID, parent, k, err)
			}
			checkCopied(t, runID, parent, k, finished(parent), stored(t, store, runID, got))
			if !sameResult(got, want) {
				t.Fatalf("fork %s of %s at %d fed the same replies: %s after %d steps, the source %s after %d",
					runID, parent, k, got.StopReason, len(got.Steps), want.StopReason, len(want.Steps))
			}
			checkRanOnlyFrom(t, "fork "+runID, f.tools, k)
			if ran := f.tools.ran(); !reflect.DeepEqual(ran, from(srcRan, k)) {
				t.Fatalf("fork %s of %s at %d ran turns %v; the source ran %v from there", runID, parent, k, ran, from(srcRan, k))
			}
			_, srcCalls := callsFrom(src.model, k)
			if before, calls := callsFrom(f.model, k); before > 0 || !reflect.DeepEqual(calls, srcCalls) {
				t.Fatalf("fork %s of %s at %d called the model at %v and %d times before %d; the source at %v from %d",
					runID, parent, k, calls, before, k, srcCalls, k)
			}
		}
		// diverges forks parent at k under other replies from k and holds
		// the fork to a run fed those replies from the start.
		diverges := func(parent, runID string, k int) {
			script, outcomes := splice(s.turns, other.turns, k), splice(s.outcomes, other.outcomes, k)
			ref := s.on(&seamstest.MemStore{}, "ref", script, outcomes, nil)
			wantOther, err := engine.Run(ctx, ref.def, ref.req)
			if err != nil {
				t.Fatalf("reference run fed other replies from %d: %v", k, err)
			}
			f := s.on(store, runID, script, outcomes, nil)
			got, err := engine.Fork(ctx, f.def, f.req, parent, k)
			if err != nil {
				t.Fatalf("fork %s of %s at %d under other replies: %v", runID, parent, k, err)
			}
			checkCopied(t, runID, parent, k, finished(parent), stored(t, store, runID, got))
			if len(got.Steps) < k || !proptest.SameSteps(got.Steps[:k], want.Steps[:k]) {
				t.Fatalf("fork %s of %s at %d under other replies: its first %d steps are not the source's", runID, parent, k, k)
			}
			if !sameResult(got, wantOther) {
				t.Fatalf("fork %s of %s at %d under other replies: %s after %d steps, a run fed them from the start %s after %d",
					runID, parent, k, got.StopReason, len(got.Steps), wantOther.StopReason, len(wantOther.Steps))
			}
			checkRanOnlyFrom(t, "fork "+runID, f.tools, k)
			if ran, refRan := f.tools.ran(), from(ref.tools.ran(), k); !reflect.DeepEqual(ran, refRan) {
				t.Fatalf("fork %s of %s at %d under other replies ran turns %v; a run fed them from the start ran %v from there", runID, parent, k, ran, refRan)
			}
			if len(got.Steps) > k && !proptest.SameSteps(got.Steps[k:], want.Steps[min(k, n):]) {
				countFork(func() { forkStats.diverged[kind]++ })
			}
		}

		// Every k on MemStore; on kv and PostgreSQL, whose forks cost
		// more, the same replies at every k and the rest at drawn steps.
		every := func(label string) []int {
			if kind != "memory" {
				return []int{rapid.IntRange(0, n).Draw(t, label)}
			}
			ks := make([]int, n+1)
			for k := range ks {
				ks[k] = k
			}
			return ks
		}
		forks, forksOfForks := 0, 0
		for k := 0; k <= n; k++ {
			retraces("src", fmt.Sprint("same-", k), k)
			forks++
		}
		for _, k := range every("diverges_at") {
			diverges("src", fmt.Sprint("other-", k), k)
			forks++
		}
		k1 := rapid.IntRange(0, n).Draw(t, "fork_of_forks_at")
		parent := fmt.Sprint("same-", k1)
		for _, k2 := range every("fork_of_fork_at") {
			retraces(parent, fmt.Sprintf("same-%d-%d", k1, k2), k2)
			forksOfForks++
		}
		k2 := rapid.IntRange(0, n).Draw(t, "fork_of_fork_diverges_at")
		diverges(parent, fmt.Sprintf("other-%d-%d", k1, k2), k2)
		countFork(func() {
			forkStats.runs[kind]++
			forkStats.steps[n]++
			forkStats.forks[kind] += forks
			forkStats.forksOfForks[kind] += forksOfForks + 1
		})
	})
	forkStats.Lock()
	defer forkStats.Unlock()
	t.Logf("generated runs %v, by their steps %v; forks of them %v (%v under other replies that changed the trajectory); forks of forks %v",
		forkStats.runs, forkStats.steps, forkStats.forks, forkStats.diverged, forkStats.forksOfForks)
	checkCovered(t, kinds, forkStats.runs)
}

// TestPropertyAForkRacingItsSourceCopiesAConsistentPrefix: while the
// source is driven by one goroutine, 1–4 others each wait for a drawn
// number of its steps to complete and fork it there (or a step or two
// before), under the same replies. Every fork's log is sound; what it
// copied is the source's events up to the end of step k−1 exactly as the
// source finally holds them — payloads naming the source, never an event
// of step k, not half a step — and everything after the copy is the
// fork's own; and each fork ends as the source ended, running only the
// actions of steps k and later. Under the race detector it generates a
// quarter of -rapid.checks.
func TestPropertyAForkRacingItsSourceCopiesAConsistentPrefix(t *testing.T) {
	if raceDetector {
		fewerChecks(t, 4)
	}
	ctx := context.Background()
	stores := newStoreFactory(t)
	kinds := forkingKinds(t, stores, 6)
	byKind := map[string]int{}
	forkStats.live = map[string]int{}
	rapid.Check(t, func(t *rapid.T) {
		s := drawForkScenario(t)
		kind := rapid.SampledFrom(kinds).Draw(t, "store")
		store, closeStore := stores.open(t, kind)
		defer closeStore()
		src := s.on(store, "src", s.turns, s.outcomes, nil)
		src.model.OnCall = func(seams.ModelCall) { runtime.Gosched() }

		type racer struct {
			waitFor, back int
			f             forker
			k             int
			live, midStep bool
			got           events.RunResult
			err           error
		}
		racers := make([]*racer, rapid.IntRange(1, 4).Draw(t, "forks"))
		for j := range racers {
			racers[j] = &racer{waitFor: rapid.IntRange(0, len(s.turns)).Draw(t, fmt.Sprint("fork_", j, "_waits_for_steps")),
				back: rapid.IntRange(0, 2).Draw(t, fmt.Sprint("fork_", j, "_steps_back")),
				f:    s.on(store, fmt.Sprint("fork-", j), s.turns, s.outcomes, nil)}
		}
		var want events.RunResult
		var srcErr error
		var wg sync.WaitGroup
		wg.Go(func() { want, srcErr = engine.Run(ctx, src.def, src.req) })
		for _, r := range racers {
			wg.Go(func() {
				for {
					stream, err := store.Load(ctx, "src")
					if err != nil {
						r.err = err
						return
					}
					completed := 0
					for _, env := range stream {
						if env.Kind == events.KindStepCompleted {
							completed++
						}
					}
					finished := len(stream) > 0 && stream[len(stream)-1].Kind == events.KindRunFinished
					if len(stream) > 0 && (completed >= r.waitFor || finished) {
						r.k, r.live = max(0, completed-r.back), !finished
						r.midStep = r.live && stream[len(stream)-1].Kind != events.KindStepCompleted
						break
					}
					runtime.Gosched()
				}
				r.got, r.err = engine.Fork(ctx, r.f.def, r.f.req, "src", r.k)
			})
		}
		wg.Wait()
		if srcErr != nil {
			t.Fatalf("source run: %v", srcErr)
		}
		final := stored(t, store, "src", want)
		srcRan := src.tools.ran()
		for _, r := range racers {
			id := r.f.req.RunID
			if r.err != nil {
				t.Fatalf("%s at step %d: %v", id, r.k, r.err)
			}
			log := stored(t, store, id, r.got)
			checkCopied(t, id, "src", r.k, final, log)
			if !sameResult(r.got, want) {
				t.Fatalf("%s at step %d fed the same replies: %s after %d steps, the source %s after %d",
					id, r.k, r.got.StopReason, len(r.got.Steps), want.StopReason, len(want.Steps))
			}
			checkRanOnlyFrom(t, id, r.f.tools, r.k)
			if ran := r.f.tools.ran(); !reflect.DeepEqual(ran, from(srcRan, r.k)) {
				t.Fatalf("%s at step %d ran turns %v; the source ran %v from there", id, r.k, ran, from(srcRan, r.k))
			}
			countFork(func() {
				if r.live {
					forkStats.live[kind]++
				}
				if r.midStep {
					forkStats.midStep++
				}
			})
		}
		countFork(func() { byKind[kind] += len(racers) })
	})
	forkStats.Lock()
	defer forkStats.Unlock()
	t.Logf("racing forks by store %v: %v read the source while it ran, %d of them with a step in flight", byKind, forkStats.live, forkStats.midStep)
	if forkStats.midStep == 0 {
		t.Errorf("no fork raced its source mid-step")
	}
	checkCovered(t, kinds, byKind)
}

// forkingProcess is a process (decisions_test.go) whose store forks runs:
// the copy is one of its appends, so the process dies before it or after
// it like at any other write. (crashstore.Store does not fork runs.)
type forkingProcess struct{ *process }

// ForkRun implements seams.RunForker.
func (p forkingProcess) ForkRun(ctx context.Context, runID string, started events.RunStarted, source string, through ulid.ULID, n int) ([]events.Envelope, error) {
	p.mu.Lock()
	if p.dead || p.after >= 0 && p.appends >= p.after {
		p.dead = true
		p.mu.Unlock()
		return nil, proptest.ErrCrashed
	}
	p.appends++
	p.mu.Unlock()
	return p.inner.(seams.RunForker).ForkRun(ctx, runID, started, source, through, n)
}

// TestPropertyAForkSurvivesACrashAtEveryWrite: a finished run is forked
// at a drawn step, under the same replies or other ones, by a process
// that dies at each of the fork's writes in turn — the copy is the first.
// Afterwards either the fork does not exist (the copy was not made), and
// forking again succeeds, or it does and is sound, a second fork onto it
// is refused, and Resume with the fork's definition continues it to the
// uncrashed fork's end (or stops resume_state_unknown, trajectory
// unchanged, exactly when a never action was in doubt). The tools' ledger,
// across both processes: nothing of the copied steps ran, no never action
// ran twice, and the turns that ran are the uncrashed fork's.
//
// Each check crashes a fork at every write, so it generates half of
// -rapid.checks, and a tenth under the race detector.
func TestPropertyAForkSurvivesACrashAtEveryWrite(t *testing.T) {
	fewerChecks(t, 2)
	if raceDetector {
		fewerChecks(t, 5)
	}
	ctx := context.Background()
	stores := newStoreFactory(t)
	kinds := forkingKinds(t, stores, 30)
	byKind := map[string]int{}
	rapid.Check(t, func(t *rapid.T) {
		s := drawForkScenario(t)
		other := drawForkScenario(t) // only its turns and outcomes are used
		kind := rapid.SampledFrom(kinds).Draw(t, "store")
		store, closeStore := stores.open(t, kind)
		defer closeStore()
		src := s.on(store, "src", s.turns, s.outcomes, nil)
		done, err := engine.Run(ctx, src.def, src.req)
		if err != nil {
			t.Fatalf("source run: %v", err)
		}
		k := rapid.IntRange(0, len(done.Steps)).Draw(t, "fork_at")
		script, outcomes := s.turns, s.outcomes
		if rapid.Bool().Draw(t, "other_replies") {
			script, outcomes = splice(s.turns, other.turns, k), splice(s.outcomes, other.outcomes, k)
		}
		counted := forkingProcess{&process{inner: store, after: -1}}
		ref := s.on(counted, "ref", script, outcomes, nil)
		want, err := engine.Fork(ctx, ref.def, ref.req, "src", k)
		if err != nil {
			t.Fatalf("uncrashed fork at %d: %v", k, err)
		}
		stored(t, store, "ref", want)
		refRan := ref.tools.ran()
		for crash := 0; crash < counted.appends; crash++ {
			id := fmt.Sprint("crash-", crash)
			what := fmt.Sprintf("fork at %d crashed at write %d", k, crash)
			tools := newToolLedger(script, outcomes)
			dying := s.on(forkingProcess{&process{inner: store, after: crash}}, id, script, outcomes, tools)
			if _, err := engine.Fork(ctx, dying.def, dying.req, "src", k); !errors.Is(err, proptest.ErrCrashed) {
				t.Fatalf("%s: the fork ended with %v", what, err)
			}
			durable, err := store.Load(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			next := s.on(store, id, script, outcomes, tools) // the next process, the same tools
			var got events.RunResult
			inDoubtNever := false
			if len(durable) == 0 {
				if crash != 0 {
					t.Fatalf("%s: the fork has no log, but the copy was made", what)
				}
				if got, err = engine.Fork(ctx, next.def, next.req, "src", k); err != nil {
					t.Fatalf("%s, its copy not made: forking again: %v", what, err)
				}
				countFork(func() { forkStats.notCopied++ })
			} else {
				v, err := recovery.Classify(id, durable)
				if err != nil {
					t.Fatalf("%s left a corrupt log: %v", what, err)
				}
				inDoubtNever = v.InDoubt != nil && v.InDoubt.ReplayPolicy == events.ReplayNever
				again := s.on(store, id, script, outcomes, newToolLedger(script, outcomes))
				if _, err := engine.Fork(ctx, again.def, again.req, "src", k); !errors.Is(err, engine.ErrRunExists) {
					t.Fatalf("%s: a second fork onto it: %v, want ErrRunExists", what, err)
				}
				if got, err = engine.Resume(ctx, next.def, next.req); err != nil {
					t.Fatalf("%s: resume: %v", what, err)
				}
			}
			final := stored(t, store, id, got)
			checkRanOnlyFrom(t, what, tools, k)
			ran := tools.ran()
			switch {
			case (got.StopReason == events.StopResumeStateUnknown) != inDoubtNever:
				t.Fatalf("%s: stop %s, but a never action in doubt = %t", what, got.StopReason, inDoubtNever)
			case inDoubtNever:
				if !proptest.SameSteps(got.Steps, want.Steps[:min(len(got.Steps), len(want.Steps))]) {
					t.Fatalf("%s: resume_state_unknown changed the trajectory", what)
				}
				for turn := range ran {
					if refRan[turn] == 0 {
						t.Fatalf("%s: turn %d ran, which the uncrashed fork did not run", what, turn)
					}
				}
				countFork(func() { forkStats.unknown++ })
			case !sameResult(got, want):
				t.Fatalf("%s: resumed to %s after %d steps, the uncrashed fork %s after %d", what, got.StopReason, len(got.Steps), want.StopReason, len(want.Steps))
			case !reflect.DeepEqual(slices.Sorted(maps.Keys(ran)), slices.Sorted(maps.Keys(refRan))):
				t.Fatalf("%s: ran turns %v, the uncrashed fork %v", what, ran, refRan)
			}
			if r := final[0].Event.(events.RunStarted).Fork; r == nil || r.Run != "src" || r.Step != k {
				t.Fatalf("%s: its RunStarted records %+v", what, r)
			}
			countFork(func() { forkStats.crashPoints++ })
		}
		countFork(func() { byKind[kind] += counted.appends })
	})
	forkStats.Lock()
	defer forkStats.Unlock()
	t.Logf("crash points of forks by store %v: %d of them before the copy (forked again), %d stopped resume_state_unknown",
		byKind, forkStats.notCopied, forkStats.unknown)
	checkCovered(t, kinds, byKind)
	if forkStats.unknown == 0 {
		t.Errorf("no crash left a fork's never action in doubt")
	}
}

// checkCopied holds the log of run id, forked from parent at step k, to
// parent's log as it is now: its RunStarted names parent, k and the key
// of the last event it copied; that event ends step k−1 of parent's log
// (no event of step k, not half a step); the events copied are parent's
// first, as parent holds them; and everything after them names run id.
func checkCopied(t *rapid.T, id, parent string, k int, source, log []events.Envelope) {
	origin := log[0].Event.(events.RunStarted).Fork
	if origin == nil || origin.Run != parent || origin.Step != k {
		t.Fatalf("%s forked from %s at %d records %+v", id, parent, k, origin)
	}
	// p: the events after RunStarted the fork copied.
	p := 0
	if origin.LastKey != "" {
		p = slices.IndexFunc(source, func(env events.Envelope) bool { return env.ID.String() == origin.LastKey })
		if p < 1 {
			t.Fatalf("%s copied up to %s, not an event of %s after its start", id, origin.LastKey, parent)
		}
	}
	completed := 0
	for _, env := range source[1 : p+1] {
		if env.Kind == events.KindStepCompleted {
			completed++
		}
	}
	if completed != k || p > 0 && source[p].Kind != events.KindStepCompleted {
		t.Fatalf("%s at step %d copied the first %d events of %s: %d steps, ending with %s", id, k, p, parent, completed, source[p].Kind)
	}
	if len(log) < 1+p {
		t.Fatalf("%s at step %d holds %d events, fewer than the %d it copied", id, k, len(log), p)
	}
	for i, env := range log[1:] {
		switch owner := events.RunIDOf(env.Event); {
		case i < p && !reflect.DeepEqual(env.Event, source[1+i].Event):
			t.Fatalf("%s at step %d: copied event %d is not %s's as it holds it:\n%+v\n%+v", id, k, 1+i, parent, env.Event, source[1+i].Event)
		case i >= p && owner != id:
			t.Fatalf("%s at step %d: event %d (%s), after the copy, names run %q: more than the prefix was copied", id, k, 1+i, env.Kind, owner)
		}
	}
}
