package engine_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/projections"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

func openKV(t *testing.T) *kv.Store {
	t.Helper()
	s, err := kv.Open(filepath.Join(t.TempDir(), "runs.db"), kv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func budget() engine.Budget {
	return engine.Budget{MaxSteps: 10, MaxActions: 10, MaxConsecutiveParseFailures: 2, MaxPromptChars: 100_000}
}

// agent is a test rig: a scripted model and executor on a store.
type agent struct {
	model *seamstest.Model
	exec  *seamstest.Executor
	def   engine.Definition
	req   engine.Request
}

func newAgent(store seams.RunStore, runID string, turns ...seamstest.Turn) *agent {
	a := &agent{model: &seamstest.Model{Turns: turns}, exec: &seamstest.Executor{}}
	a.def = engine.Definition{Model: a.model, Parser: seamstest.Parser{}, Store: store}
	a.req = engine.Request{
		RunID: runID, Budget: budget(), Executor: a.exec, ModelReplayPolicy: events.ReplaySafe,
		Context: engine.Context{
			RunLevel:  []seams.Message{seams.Text(seams.RoleSystem, "You are a careful agent.")},
			GoalLevel: []seams.Message{seams.Text(seams.RoleUser, "Count the files.")},
		},
		ObservationTemplate: "Observation: {observation}",
	}
	return a
}

func (a *agent) run(t *testing.T) events.RunResult {
	t.Helper()
	r, err := engine.Run(context.Background(), a.def, a.req)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return r
}

// soundLog loads a run and checks its structure; it returns the stream.
func soundLog(t *testing.T, store seams.RunStore, runID string) []events.Envelope {
	t.Helper()
	stream, err := store.Load(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	if err := recovery.Check(runID, stream); err != nil {
		t.Fatalf("log is not sound: %v", err)
	}
	return stream
}

func toolRegistry(t *testing.T) *seams.Registry {
	t.Helper()
	r, err := seams.NewRegistry(
		seams.Tool{Spec: seams.ToolSpec{Name: "count", ReplayPolicy: events.ReplaySafe,
			Parameters: map[string]any{"type": "object", "required": []string{"dir"},
				"properties": map[string]any{"dir": map[string]any{"type": "string"}}}},
			Handler: func(_ context.Context, args map[string]any) (string, error) { return "3 files", nil }},
		seams.Tool{Spec: seams.ToolSpec{Name: "submit", CompletesRun: true},
			Handler: func(context.Context, map[string]any) (string, error) { return "accepted", nil }},
	)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestEveryStopReasonThroughRun reaches each of the ten stop reasons on the
// real kv store, and checks the log each leaves is sound.
func TestEveryStopReasonThroughRun(t *testing.T) {
	cases := []struct {
		reason events.StopReason
		setup  func(t *testing.T, a *agent)
		steps  int
	}{
		{events.StopTaskCompleted, func(t *testing.T, a *agent) {
			a.model.Turns = seamstest.Replies("ACTION: ls", "ACTION: make")
			a.exec.Respond = func(_ context.Context, c seams.ActionCall) (events.ActionOutcome, error) {
				return events.ActionOutcome{Status: events.StatusExecuted, Observation: "built", EnvReportedCompletion: c.StepIdx == 1}, nil
			}
		}, 2},
		{events.StopStepBudget, func(t *testing.T, a *agent) {
			a.model.Turns = seamstest.Replies("ACTION: a", "nonsense", "ACTION: c", "ACTION: d")
			a.req.Budget.MaxSteps = 3
		}, 3},
		{events.StopParseFailedRepeatedly, func(t *testing.T, a *agent) {
			a.model.Turns = seamstest.Replies("hmm", "ACTION: a", "well", "uh")
		}, 4},
		{events.StopContextOverflow, func(t *testing.T, a *agent) {
			a.model.Turns = seamstest.Replies("ACTION: "+strings.Repeat("x", 200), "ACTION: b")
			a.req.Budget.MaxPromptChars = 200
		}, 1},
		{events.StopEnvError, func(t *testing.T, a *agent) {
			a.model.Turns = seamstest.Replies("ACTION: rm -rf /")
			a.exec.Respond = func(context.Context, seams.ActionCall) (events.ActionOutcome, error) {
				return events.ActionOutcome{}, errors.New("sandbox died")
			}
		}, 1},
		{events.StopLLMError, func(t *testing.T, a *agent) {
			a.model.Turns = []seamstest.Turn{{Err: errors.New("503 from upstream")}}
		}, 1},
		{events.StopAgentFinished, func(t *testing.T, a *agent) {
			a.model.Turns = seamstest.Replies("ACTION: ls", "FINAL: 3 files")
		}, 2},
		{events.StopActionBudget, func(t *testing.T, a *agent) {
			a.model.Turns = seamstest.Replies("ACTION: a", "TOOL nope {}", "ACTION: b", "ACTION: c")
			a.req.Budget.MaxActions = 2
		}, 3},
		{events.StopCancelled, func(t *testing.T, a *agent) {
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			a.model.Turns = append(seamstest.Replies("ACTION: a"), seamstest.Turn{Block: true})
			a.model.OnCall = func(c seams.ModelCall) {
				if c.CallIndex == 1 {
					cancel()
				}
			}
			a.def.Model = cancelAware{a.model, ctx}
		}, 1},
	}
	for _, c := range cases {
		t.Run(string(c.reason), func(t *testing.T) {
			store := openKV(t)
			a := newAgent(store, "run-"+string(c.reason))
			c.setup(t, a)
			ctx := context.Background()
			if m, ok := a.def.Model.(cancelAware); ok {
				ctx = m.ctx
			}
			r, err := engine.Run(ctx, a.def, a.req)
			if err != nil {
				t.Fatal(err)
			}
			if r.StopReason != c.reason || len(r.Steps) != c.steps {
				t.Fatalf("stop %s after %d steps, want %s after %d", r.StopReason, len(r.Steps), c.reason, c.steps)
			}
			soundLog(t, store, a.req.RunID)
		})
	}
	t.Run(string(events.StopTaskCompleted)+"/completes_run_tool", func(t *testing.T) {
		store := openKV(t)
		a := newAgent(store, "tool-run", seamstest.Replies(`TOOL count {"dir":"."}`, `TOOL submit {}`)...)
		a.req.Tools = toolRegistry(t)
		a.req.Executor = a.req.Tools.Executor()
		r := a.run(t)
		if r.StopReason != events.StopTaskCompleted || len(r.Steps) != 2 || *r.Steps[1].ToolName != "submit" {
			t.Fatalf("%+v", r)
		}
	})
	t.Run(string(events.StopResumeStateUnknown), func(t *testing.T) {
		store := openKV(t)
		a := newAgent(store, "in-doubt", seamstest.Replies("ACTION: pay invoice", "FINAL: paid")...)
		// Crash after the action intent is durable, before its outcome is.
		crashing := &proptest.CrashingStore{Inner: store, After: 2}
		a.def.Store = crashing
		if _, err := engine.Run(context.Background(), a.def, a.req); !errors.Is(err, proptest.ErrCrashed) {
			t.Fatalf("crash: %v", err)
		}
		a.def.Store = store
		r, err := engine.Resume(context.Background(), a.def, a.req)
		if err != nil {
			t.Fatal(err)
		}
		if r.StopReason != events.StopResumeStateUnknown {
			t.Fatalf("stop %s, want resume_state_unknown", r.StopReason)
		}
		if n := len(a.exec.Calls()); n != 1 {
			t.Fatalf("the never action was executed %d times", n)
		}
		soundLog(t, store, "in-doubt")
	})
}

// cancelAware carries the context a test cancels, so the case table can
// hand it to Run.
type cancelAware struct {
	*seamstest.Model
	ctx context.Context
}

// TestDurableTransactionsPerStep: two per step with coalescing, four with
// one event per transaction, measured as the marginal cost of three more
// action steps.
func TestDurableTransactionsPerStep(t *testing.T) {
	txs := func(t *testing.T, oneEvent bool, actions int) uint64 {
		store := openKV(t)
		var replies []string
		for i := range actions {
			replies = append(replies, fmt.Sprintf("ACTION: a%d", i))
		}
		a := newAgent(store, "tx", seamstest.Replies(append(replies, "FINAL: done")...)...)
		a.req.OneEventPerTransaction = oneEvent
		before := store.Transactions()
		if r := a.run(t); r.StopReason != events.StopAgentFinished {
			t.Fatal(r.StopReason)
		}
		return store.Transactions() - before
	}
	for _, c := range []struct {
		oneEvent bool
		want     uint64
	}{{false, 2}, {true, 4}} {
		perStep := (txs(t, c.oneEvent, 6) - txs(t, c.oneEvent, 3)) / 3
		if perStep != c.want {
			t.Errorf("one event per transaction=%v: %d durable transactions per step, want %d", c.oneEvent, perStep, c.want)
		}
	}
}

// TestInvalidRequestsAreRejectedBeforeAnyWrite: each bad request fails with
// an error naming the field, and the store holds no stream afterwards.
func TestInvalidRequestsAreRejectedBeforeAnyWrite(t *testing.T) {
	other := toolRegistry(t)
	cases := []struct {
		name  string
		edit  func(*engine.Request)
		field string
	}{
		{"empty run id", func(r *engine.Request) { r.RunID = "" }, "RunID: seams: invalid run id: it is empty"},
		{"a 40 KB run id, not echoed whole", func(r *engine.Request) { r.RunID = strings.Repeat("x", 40<<10) },
			`RunID: seams: invalid run id: it is 40960 bytes, longer than the 1024-byte limit (it begins "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx`},
		{"a run id with a NUL byte", func(r *engine.Request) { r.RunID = "a\x00b" }, `RunID: seams: invalid run id "a\x00b": it holds a NUL byte`},
		{"a run id that is not UTF-8", func(r *engine.Request) { r.RunID = "\xff" }, `RunID: seams: invalid run id "\xff": it is not valid UTF-8`},
		{"a run id with an escape sequence", func(r *engine.Request) { r.RunID = "\x1b[2J" }, "RunID: seams: invalid run id \"\\x1b[2J\": it holds the control character U+001B"},
		// A zero budget field is its default (TestAZeroBudgetFieldTakesItsDefault).
		{"negative steps", func(r *engine.Request) { r.Budget.MaxSteps = -1 }, "Budget.MaxSteps"},
		{"negative actions", func(r *engine.Request) { r.Budget.MaxActions = -1 }, "Budget.MaxActions"},
		{"negative parse failures", func(r *engine.Request) { r.Budget.MaxConsecutiveParseFailures = -3 }, "Budget.MaxConsecutiveParseFailures"},
		{"negative prompt chars", func(r *engine.Request) { r.Budget.MaxPromptChars = -100 }, "Budget.MaxPromptChars"},
		{"negative tokens", func(r *engine.Request) { r.Budget.MaxTotalTokens = -1 }, "Budget.MaxTotalTokens"},
		{"unset model replay policy", func(r *engine.Request) { r.ModelReplayPolicy = "" }, "ModelReplayPolicy is unset"},
		{"unknown model replay policy", func(r *engine.Request) { r.ModelReplayPolicy = "sometimes" }, `ModelReplayPolicy "sometimes"`},
		{"observation template without placeholder", func(r *engine.Request) { r.ObservationTemplate = "Observation:" }, "ObservationTemplate"},
		{"observation template with two", func(r *engine.Request) { r.ObservationTemplate = "{observation}{observation}" }, "ObservationTemplate"},
		{"observation template larger than a stored text", func(r *engine.Request) {
			r.ObservationTemplate = strings.Repeat(" ", events.MaxTextBytes) + "{observation}"
		}, "ObservationTemplate is 8388621 bytes, at most 8388608"},
		{"tool section without placeholder", func(r *engine.Request) { r.ToolSectionTemplate = "Tools below" }, "ToolSectionTemplate"},
		{"negative grace", func(r *engine.Request) { r.CancelGrace = -time.Second }, "CancelGrace"},
		{"nil executor", func(r *engine.Request) { r.Executor = nil }, "Executor"},
		{"typed-nil executor", func(r *engine.Request) { r.Executor = (*seams.ToolExecutor)(nil) }, "Executor"},
		{"typed-nil scripted executor", func(r *engine.Request) { r.Executor = (*seamstest.Executor)(nil) }, "Executor"},
		{"executor of a nil registry", func(r *engine.Request) { var reg *seams.Registry; r.Executor = reg.Executor() }, "nil *seams.Registry"},
		{"executor of another registry", func(r *engine.Request) { r.Tools = toolRegistry(t); r.Executor = other.Executor() }, "Executor"},
		{"injection without id", func(r *engine.Request) {
			r.Injections = map[string][]engine.Injection{"skills": {{Content: "be brief"}}}
		}, "Injections"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			store := openKV(t)
			a := newAgent(store, "bad", seamstest.Replies("FINAL: x")...)
			c.edit(&a.req)
			_, err := engine.Run(context.Background(), a.def, a.req)
			if !errors.Is(err, engine.ErrInvalidRequest) || !strings.Contains(err.Error(), c.field) || len(err.Error()) > 2000 {
				t.Fatalf("got %.3000v, want ErrInvalidRequest naming %s", err, c.field)
			}
			if strings.HasPrefix(c.field, "RunID") && !errors.Is(err, seams.ErrInvalidRunID) {
				t.Fatalf("got %v, want it to match seams.ErrInvalidRunID too, as the stores' refusals do", err)
			}
			runID := a.req.RunID
			if runID == "" {
				runID = "bad"
			}
			if got, _ := store.Load(context.Background(), runID); len(got) != 0 {
				t.Fatalf("rejected request wrote %d events", len(got))
			}
			if txs := store.Transactions(); txs != 0 {
				t.Fatalf("rejected request committed %d transactions", txs)
			}
		})
	}
	defs := []struct {
		name  string
		edit  func(*engine.Definition)
		field string
	}{
		{"nil parser", func(d *engine.Definition) { d.Parser = nil }, "Definition.Parser"},
		{"typed-nil store", func(d *engine.Definition) { d.Store = (*kv.Store)(nil) }, "Definition.Store"},
		{"typed-nil model", func(d *engine.Definition) { d.Model = (*seamstest.Model)(nil) }, "Definition.Model"},
		{"typed-nil sink", func(d *engine.Definition) { d.Events = (*seamstest.Sink)(nil) }, "Definition.Events"},
	}
	for _, c := range defs {
		t.Run(c.name, func(t *testing.T) {
			store := openKV(t)
			a := newAgent(store, "bad")
			c.edit(&a.def)
			for name, drive := range map[string]func(context.Context, engine.Definition, engine.Request) (events.RunResult, error){
				"Run": engine.Run, "Resume": engine.Resume,
			} {
				if _, err := drive(context.Background(), a.def, a.req); !errors.Is(err, engine.ErrInvalidDefinition) || !strings.Contains(err.Error(), c.field) {
					t.Fatalf("%s: got %v, want ErrInvalidDefinition naming %s", name, err, c.field)
				}
			}
			if txs := store.Transactions(); txs != 0 {
				t.Fatalf("rejected definition committed %d transactions", txs)
			}
		})
	}
}

func TestRunRefusesAnExistingRun(t *testing.T) {
	store := openKV(t)
	a := newAgent(store, "twice", seamstest.Replies("FINAL: x")...)
	a.run(t)
	before := store.Transactions()
	if _, err := engine.Run(context.Background(), a.def, a.req); !errors.Is(err, engine.ErrRunExists) {
		t.Fatalf("got %v, want ErrRunExists", err)
	}
	if store.Transactions() != before {
		t.Fatal("second Run wrote")
	}
}

// TestConsumerFailuresNeverDamageTheLog: a failing model, a panicking
// executor, a failing or panicking sink, a panicking parser.
func TestConsumerFailuresNeverDamageTheLog(t *testing.T) {
	t.Run("model error is an llm_error step", func(t *testing.T) {
		store := openKV(t)
		a := newAgent(store, "m", seamstest.Turn{Err: errors.New("rate limited")})
		r := a.run(t)
		s := r.Steps[0]
		if r.StopReason != events.StopLLMError || s.Observation != engine.DefaultModelCallFailed || !s.ObservationIsSynthetic || s.CallID != nil {
			t.Fatalf("%+v / %+v", r, s)
		}
		log := soundLog(t, store, "m")
		if f := log[2].Event.(events.ModelCallResult).Failure; f == nil || *f != "rate limited" {
			t.Fatalf("failure not recorded: %+v", log[2].Event)
		}
	})
	t.Run("model panic is an llm_error step", func(t *testing.T) {
		store := openKV(t)
		a := newAgent(store, "mp")
		a.model.OnCall = func(seams.ModelCall) { panic("client bug") }
		if r := a.run(t); r.StopReason != events.StopLLMError {
			t.Fatal(r.StopReason)
		}
		soundLog(t, store, "mp")
	})
	t.Run("executor panic is env_error with the synthetic text", func(t *testing.T) {
		store := openKV(t)
		a := newAgent(store, "e", seamstest.Replies("ACTION: boom")...)
		a.def.Synthetic.EnvFailed = "The sandbox crashed."
		a.exec.Respond = func(context.Context, seams.ActionCall) (events.ActionOutcome, error) { panic("segfault") }
		r := a.run(t)
		s := r.Steps[0]
		if r.StopReason != events.StopEnvError || *s.ActionStatus != events.StatusEnvError || s.Observation != "Observation: The sandbox crashed." {
			t.Fatalf("%+v / %+v", r.StopReason, s)
		}
		soundLog(t, store, "e")
	})
	t.Run("tool handler panic is env_error", func(t *testing.T) {
		store := openKV(t)
		reg, _ := seams.NewRegistry(seams.Tool{Spec: seams.ToolSpec{Name: "boom"},
			Handler: func(context.Context, map[string]any) (string, error) { panic("handler bug") }})
		a := newAgent(store, "tp", seamstest.Replies("TOOL boom {}")...)
		a.req.Tools, a.req.Executor = reg, reg.Executor()
		if r := a.run(t); r.StopReason != events.StopEnvError {
			t.Fatal(r.StopReason)
		}
		soundLog(t, store, "tp")
	})
	t.Run("parser panic is an invalid decision", func(t *testing.T) {
		store := openKV(t)
		a := newAgent(store, "pp", seamstest.Replies("x", "y")...)
		a.def.Parser = panickyParser{}
		r := a.run(t)
		if r.StopReason != events.StopParseFailedRepeatedly || !strings.Contains(*r.Steps[0].ParseError, "parser panicked") {
			t.Fatalf("%+v", r)
		}
		soundLog(t, store, "pp")
	})
	for _, sink := range []*seamstest.Sink{{Err: errors.New("sink down")}, {Panic: true}} {
		t.Run(fmt.Sprintf("sink error=%v panic=%v is counted", sink.Err, sink.Panic), func(t *testing.T) {
			turns := seamstest.Replies("ACTION: a", "FINAL: done")
			plain := newAgent(openKV(t), "s", turns...).run(t)
			store := openKV(t)
			a := newAgent(store, "s", turns...)
			a.def.Events = sink
			r := a.run(t)
			stream := soundLog(t, store, "s")
			// Every delivery failed; the result counts those before the
			// run's final append (the final answer's model_call_result,
			// step_completed and run_finished), whose events are delivered
			// only once the result is stored.
			if r.EventDeliveryFailures != len(stream)-3 || len(sink.Envelopes()) != len(stream) {
				t.Fatalf("%d failures counted, %d delivered, %d events", r.EventDeliveryFailures, len(sink.Envelopes()), len(stream))
			}
			// One result: returned, stored, resumed and projected alike.
			stored, _ := projections.Fold(stream).Result()
			resumed, err := engine.Resume(context.Background(), a.def, a.req)
			if err != nil {
				t.Fatal(err)
			}
			for name, other := range map[string]events.RunResult{"stored": stored, "resumed": resumed} {
				if other.EventDeliveryFailures != r.EventDeliveryFailures || other.StopReason != r.StopReason ||
					!proptest.SameSteps(other.Steps, r.Steps) {
					t.Fatalf("Run returned %d failures, the %s result holds %d", r.EventDeliveryFailures, name, other.EventDeliveryFailures)
				}
			}
			if !proptest.SameSteps(plain.Steps, r.Steps) || plain.StopReason != r.StopReason {
				t.Fatal("a failing sink changed the run")
			}
		})
	}
	t.Run("sink receives every durable event in order", func(t *testing.T) {
		store := openKV(t)
		a := newAgent(store, "ok", seamstest.Replies("ACTION: a", "FINAL: done")...)
		a.def.Events = &seamstest.Sink{}
		if r := a.run(t); r.EventDeliveryFailures != 0 {
			t.Fatal(r.EventDeliveryFailures)
		}
		stream := soundLog(t, store, "ok")
		got := a.def.Events.(*seamstest.Sink).Envelopes()
		if len(got) != len(stream) {
			t.Fatalf("%d delivered, %d stored", len(got), len(stream))
		}
		for i := range got {
			if got[i].ID != stream[i].ID {
				t.Fatalf("event %d delivered out of order", i)
			}
		}
	})
}

type panickyParser struct{}

func (panickyParser) Parse(events.ModelReply) seams.ParsedReply { panic("parser bug") }
func (panickyParser) Parameters() map[string]string             { return nil }

// TestHundredConcurrentRunsShareOneDefinition runs under -race in CI.
func TestHundredConcurrentRunsShareOneDefinition(t *testing.T) {
	store := openKV(t)
	reg := toolRegistry(t)
	def := engine.Definition{
		Model:  &seamstest.Model{Turns: seamstest.Replies(`TOOL count {"dir":"."}`, "ACTION: x", `TOOL submit {}`)},
		Parser: seamstest.Parser{}, Store: store, Events: &seamstest.Sink{},
	}
	var wg sync.WaitGroup
	results := make([]events.RunResult, 100)
	errs := make([]error, 100)
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = engine.Run(context.Background(), def, engine.Request{
				RunID: fmt.Sprintf("c%03d", i), Budget: budget(), Tools: reg, Executor: reg.Executor(),
				ModelReplayPolicy: events.ReplayNever,
			})
		}()
	}
	wg.Wait()
	for i := range 100 {
		if errs[i] != nil {
			t.Fatalf("run %d: %v", i, errs[i])
		}
		r := results[i]
		// "ACTION: x" has no tool call, which the tool executor refuses.
		if r.StopReason != events.StopEnvError || len(r.Steps) != 2 {
			t.Fatalf("run %d: %s after %d steps", i, r.StopReason, len(r.Steps))
		}
		soundLog(t, store, r.RunID)
	}
	runs, _ := store.Runs(context.Background())
	if len(runs) != 100 {
		t.Fatalf("%d runs listed", len(runs))
	}
}

// stuckStore blocks every append holding RunFinished until its context
// ends: a store too slow to record a cancelled run's end within the grace.
type stuckStore struct{ seams.RunStore }

func (s stuckStore) Append(ctx context.Context, runID string, after ulid.ULID, evs ...events.Event) ([]events.Envelope, error) {
	for _, ev := range evs {
		if ev.Kind() == events.KindRunFinished {
			<-ctx.Done()
			return nil, ctx.Err()
		}
	}
	return s.RunStore.Append(ctx, runID, after, evs...)
}

// TestCancelGraceRunsOut: when RunFinished{cancelled} cannot be written
// within CancelGrace, Run says so and the run stays resumable.
func TestCancelGraceRunsOut(t *testing.T) {
	mem := &seamstest.MemStore{}
	a := newAgent(stuckStore{mem}, "g", append(seamstest.Replies("ACTION: a"), seamstest.Turn{Block: true})...)
	a.req.CancelGrace = 20 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	a.model.OnCall = func(c seams.ModelCall) {
		if c.CallIndex == 1 {
			cancel()
		}
	}
	_, err := engine.Run(ctx, a.def, a.req)
	if err == nil || !strings.Contains(err.Error(), "can be resumed") || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	a.def.Store = mem
	a.model.OnCall = nil
	a.model.Turns = seamstest.Replies("ACTION: a", "FINAL: done")
	r, err := engine.Resume(context.Background(), a.def, a.req)
	if err != nil || r.StopReason != events.StopAgentFinished {
		t.Fatalf("resume after the grace ran out: %v %v", r.StopReason, err)
	}
}

// TestCancellationInterruptsAnAction: an executor that honours its context
// is interrupted, and RunFinished{cancelled} is recorded with the action's
// intent unanswered.
func TestCancellationInterruptsAnAction(t *testing.T) {
	store := openKV(t)
	a := newAgent(store, "ca", seamstest.Replies("ACTION: sleep 60")...)
	ctx, cancel := context.WithCancel(context.Background())
	a.exec.Respond = func(ctx context.Context, _ seams.ActionCall) (events.ActionOutcome, error) {
		cancel()
		<-ctx.Done()
		return events.ActionOutcome{}, ctx.Err()
	}
	r, err := engine.Run(ctx, a.def, a.req)
	if err != nil || r.StopReason != events.StopCancelled || len(r.Steps) != 0 {
		t.Fatalf("%v after %d steps: %v", r.StopReason, len(r.Steps), err)
	}
	stream := soundLog(t, store, "ca")
	if k := stream[len(stream)-2].Kind; k != events.KindIntent {
		t.Fatalf("event before run_finished is %s, want the unanswered action intent", k)
	}
}

// cancelOnModelIntent cancels a run's context while the append holding its
// first model-call intent is being written: the intent becomes durable, and
// the run learns of the cancellation only once the append returns.
type cancelOnModelIntent struct {
	seams.RunStore
	cancel context.CancelFunc
}

func (s cancelOnModelIntent) Append(ctx context.Context, runID string, after ulid.ULID, evs ...events.Event) ([]events.Envelope, error) {
	for _, ev := range evs {
		if in, ok := ev.(events.Intent); ok && in.IntentKind == events.IntentModelCall {
			s.cancel()
		}
	}
	return s.RunStore.Append(ctx, runID, after, evs...)
}

// TestARunCancelledWhileItsModelIntentIsWrittenNeverCallsTheModel: a run
// cancelled while the append of its model-call intent is in flight starts
// no model call: it finishes cancelled with the intent unanswered.
func TestARunCancelledWhileItsModelIntentIsWrittenNeverCallsTheModel(t *testing.T) {
	store := openKV(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := newAgent(cancelOnModelIntent{store, cancel}, "cm", seamstest.Replies("FINAL: done")...)
	r, err := engine.Run(ctx, a.def, a.req)
	if err != nil || r.StopReason != events.StopCancelled {
		t.Fatalf("got %v, %v; want a run finished cancelled", r.StopReason, err)
	}
	if calls := a.model.Calls(); len(calls) != 0 {
		t.Fatalf("the model was called %d times after the run was cancelled", len(calls))
	}
	var kinds []events.Kind
	for _, env := range soundLog(t, store, "cm") {
		kinds = append(kinds, env.Kind)
	}
	if want := []events.Kind{events.KindRunStarted, events.KindIntent, events.KindRunFinished}; fmt.Sprint(kinds) != fmt.Sprint(want) {
		t.Fatalf("log %v, want %v (the model intent left unanswered)", kinds, want)
	}
}

// TestOnlyAnExecutedActionCompletesARun: task_completed means an action was
// executed and the goal reached; an outcome that claims completion without
// having executed does not end the run.
func TestOnlyAnExecutedActionCompletesARun(t *testing.T) {
	cases := []struct {
		status events.ActionStatus
		want   events.StopReason
	}{
		{events.StatusExecuted, events.StopTaskCompleted},
		{events.StatusNotExecuted, events.StopAgentFinished},
		{events.StatusEnvError, events.StopEnvError},
	}
	for _, c := range cases {
		t.Run(string(c.status), func(t *testing.T) {
			a := newAgent(&seamstest.MemStore{}, "c", seamstest.Replies("ACTION: deploy", "FINAL: done")...)
			a.exec.Respond = func(context.Context, seams.ActionCall) (events.ActionOutcome, error) {
				return events.ActionOutcome{Status: c.status, Observation: "claims done", EnvReportedCompletion: true}, nil
			}
			if r := a.run(t); r.StopReason != c.want {
				t.Fatalf("outcome %s reporting completion: stopped %s, want %s", c.status, r.StopReason, c.want)
			}
		})
	}
}

// keepingModel appends a note of its own to every prompt it is handed and
// keeps the result, as a client that logs or batches prompts might.
type keepingModel struct {
	*seamstest.Model
	kept [][]seams.Message
}

func (k *keepingModel) Call(ctx context.Context, call seams.ModelCall) (events.ModelReply, error) {
	k.kept = append(k.kept, append(call.Messages, seams.Text(seams.RoleUser, "client note")))
	return k.Model.Call(ctx, call)
}

// TestAPromptHandedToTheModelIsItsOwn: what a model client does with the
// messages slice (here: append to it and keep it) neither changes the
// machine's history nor is changed by the steps that follow.
func TestAPromptHandedToTheModelIsItsOwn(t *testing.T) {
	a := newAgent(&seamstest.MemStore{}, "p", seamstest.Replies("ACTION: one", "ACTION: two", "FINAL: done")...)
	km := &keepingModel{Model: a.model}
	a.def.Model = km
	r := a.run(t)
	if r.StopReason != events.StopAgentFinished || len(km.kept) != 3 {
		t.Fatalf("stopped %s after %d calls", r.StopReason, len(km.kept))
	}
	for i, msgs := range km.kept {
		last := msgs[len(msgs)-1].Content[0].(seams.TextBlock).Text
		if last != "client note" {
			t.Errorf("call %d: the client's own message became %q", i, last)
		}
	}
	calls := a.model.Calls()
	if got := len(calls[2].Messages); got != len(calls[1].Messages)+2 {
		t.Errorf("the third prompt has %d messages, want the second's %d plus a step's two", got, len(calls[1].Messages))
	}
}
