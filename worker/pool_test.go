package worker_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/parsers"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/scripted"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
	"github.com/polyloop/polyloop/worker"
)

// rig is an agent for the tests: each run makes `steps` calls of a tool
// whose policy is never (a payment, say), counted per result id in
// executions, then answers. A tool call waits for gate when it is set.
type rig struct {
	steps      int
	gate       chan struct{}
	mu         sync.Mutex
	executions map[string]int
	builds     atomic.Int64
	failBuild  atomic.Bool
	approval   bool // pay requires a person's approval
}

func newRig(steps int) *rig { return &rig{steps: steps, executions: map[string]int{}} }

func (r *rig) agent(ctx context.Context, runID string, input []byte) (engine.Definition, engine.Request, error) {
	r.builds.Add(1)
	if r.failBuild.Load() {
		return engine.Definition{}, engine.Request{}, errors.New("the agent's configuration is missing")
	}
	tools, err := seams.NewRegistry(seams.Tool{
		Spec: seams.ToolSpec{Name: "pay", ReplayPolicy: events.ReplayNever, Parameters: map[string]any{"type": "object"}, RequiresApproval: r.approval},
		Handler: func(context.Context, map[string]any) (string, error) {
			return "", errors.New("the rig's executor runs pay")
		},
	})
	if err != nil {
		return engine.Definition{}, engine.Request{}, err
	}
	var replies []string
	for range r.steps {
		replies = append(replies, `TOOL pay {}`)
	}
	replies = append(replies, "FINAL: paid "+string(input))
	def := engine.Definition{Model: &scripted.Model{Turns: scripted.Replies(replies...)}, Parser: parsers.ToolCalls{}}
	req := engine.Request{Tools: tools, Executor: payments{r}, ModelReplayPolicy: events.ReplaySafe,
		Budget:  engine.Budget{MaxSteps: r.steps + 2, MaxActions: r.steps + 2, MaxConsecutiveParseFailures: 2, MaxPromptChars: 100_000},
		Context: engine.Context{GoalLevel: []seams.Message{seams.Text(seams.RoleUser, "pay "+string(input))}}}
	return def, req, nil
}

// payments executes the rig's payments, counting each result id.
type payments struct{ r *rig }

func (p payments) Execute(ctx context.Context, call seams.ActionCall) (events.ActionOutcome, error) {
	if p.r.gate != nil {
		<-p.r.gate
	}
	p.r.mu.Lock()
	p.r.executions[call.ResultID]++
	p.r.mu.Unlock()
	return events.ActionOutcome{Status: events.StatusExecuted, Observation: "paid"}, nil
}

func (payments) Parameters() map[string]string { return map[string]string{"kind": "payments"} }

// twice lists the result ids executed more than once.
func (r *rig) twice() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for id, n := range r.executions {
		if n > 1 {
			out = append(out, fmt.Sprintf("%s ×%d", id, n))
		}
	}
	return out
}

// work runs p.Work until the returned stop is called; stop waits for Work
// to return and fails the test on its error.
func work(t *testing.T, p *worker.Pool) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- p.Work(ctx) }()
	return sync.OnceFunc(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Work: %v", err)
		}
	})
}

// results collects Options.Done's reports.
type results struct {
	mu   sync.Mutex
	runs map[string]events.RunResult
	errs map[string][]error
	all  chan string
}

func newResults() *results {
	return &results{runs: map[string]events.RunResult{}, errs: map[string][]error{}, all: make(chan string, 1024)}
}

func (r *results) done(runID string, res events.RunResult, err error) {
	r.mu.Lock()
	if err == nil {
		r.runs[runID] = res
	} else {
		r.errs[runID] = append(r.errs[runID], err)
	}
	r.mu.Unlock()
	if err == nil {
		r.all <- runID
	}
}

// waitFinished waits for n runs to finish.
func (r *results) waitFinished(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for range n {
		select {
		case <-r.all:
		case <-deadline:
			t.Fatalf("runs did not finish; errors so far: %v", r.errs)
		}
	}
}

func submit(t *testing.T, p *worker.Pool, n int) {
	t.Helper()
	for i := range n {
		if _, err := p.Submit(context.Background(), "payer", fmt.Sprintf("run-%03d", i), []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSubmittedRunsAreDrivenByTheirAgent: Submit writes RunStarted alone
// and returns; the working pool claims every run and drives it to its
// end, each payment made once.
func TestSubmittedRunsAreDrivenByTheirAgent(t *testing.T) {
	store := &seamstest.MemStore{}
	r, res := newRig(2), newResults()
	p, err := worker.New(store, map[string]worker.Agent{"payer": r.agent}, worker.Options{Concurrency: 4, ClaimInterval: 10 * time.Millisecond, Done: res.done})
	if err != nil {
		t.Fatal(err)
	}
	submit(t, p, 20)
	if log, _ := store.Load(context.Background(), "run-007"); len(log) != 1 || log[0].Kind != events.KindRunStarted {
		t.Fatalf("after Submit the run holds %d events, want its RunStarted alone", len(log))
	}
	stop := work(t, p)
	res.waitFinished(t, 20)
	stop()
	for i := range 20 {
		id := fmt.Sprintf("run-%03d", i)
		got := res.runs[id]
		if got.StopReason != events.StopAgentFinished || got.FinalAnswer == nil || *got.FinalAnswer != fmt.Sprint("paid ", i) {
			t.Errorf("%s: %+v, want agent_finished with its own input's answer", id, got)
		}
	}
	if len(r.executions) != 40 || len(r.twice()) > 0 {
		t.Fatalf("%d payments, %v twice; want 40, each once", len(r.executions), r.twice())
	}
}

// TestStoppingAWorkerInterruptsItsRunsAndAnotherFinishesThem: ending
// Work's context while every run is in a payment lets each payment
// complete, stops each run at its step boundary unfinished and not
// cancelled, nothing in doubt, each given back (awaiting); a second pool
// takes them at once and finishes them, no payment made twice.
func TestStoppingAWorkerInterruptsItsRunsAndAnotherFinishesThem(t *testing.T) {
	store := &seamstest.MemStore{}
	r, res := newRig(3), newResults()
	r.gate = make(chan struct{})
	p, err := worker.New(store, map[string]worker.Agent{"payer": r.agent}, worker.Options{Concurrency: 8, ClaimInterval: 10 * time.Millisecond, Done: res.done})
	if err != nil {
		t.Fatal(err)
	}
	submit(t, p, 8)
	stop := work(t, p)
	waitFor(t, "every run in its first payment", func() bool {
		infos, _ := store.Runs(context.Background())
		n := 0
		for _, info := range infos {
			if info.Status == seams.StatusRunning && info.Events >= 4 {
				n++
			}
		}
		return n == 8
	})
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	time.Sleep(20 * time.Millisecond) // Work is waiting for the payments
	close(r.gate)
	<-stopped
	infos, err := store.Runs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range infos {
		log, err := store.Load(context.Background(), info.RunID)
		v, verr := recovery.ClassifyLoaded(info.RunID, log, err)
		if verr != nil || v.State != recovery.BetweenSteps || info.Status != seams.StatusAwaiting || info.Steps != 1 {
			t.Errorf("%s after the shutdown: %s, tail %s, %d steps (%v); want awaiting between steps after its first step",
				info.RunID, info.Status, v.State, info.Steps, verr)
		}
	}
	for id, errs := range res.errs {
		if len(errs) != 1 || !errors.Is(errs[0], engine.ErrInterrupted) {
			t.Errorf("%s: drive ended with %v, want ErrInterrupted", id, errs)
		}
	}
	res2 := newResults()
	p2, err := worker.New(store, map[string]worker.Agent{"payer": r.agent}, worker.Options{Concurrency: 8, ClaimInterval: 10 * time.Millisecond, Done: res2.done})
	if err != nil {
		t.Fatal(err)
	}
	stop2 := work(t, p2)
	res2.waitFinished(t, 8)
	stop2()
	for id, got := range res2.runs {
		if got.StopReason != events.StopAgentFinished || len(got.Steps) != 4 {
			t.Errorf("%s: %s after %d steps, want agent_finished after 4", id, got.StopReason, len(got.Steps))
		}
	}
	if len(r.executions) != 24 || len(r.twice()) > 0 {
		t.Fatalf("%d payments, %v twice; want 24, each once", len(r.executions), r.twice())
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestARunWhoseDriveFailsIsGivenBackAndRetried: a run whose agent cannot
// be built is given back with the failure recorded and a back-off, claimed
// again after it, and finishes once the agent builds; an operator's
// Resume clears a long back-off at once.
func TestARunWhoseDriveFailsIsGivenBackAndRetried(t *testing.T) {
	store := &seamstest.MemStore{}
	r, res := newRig(1), newResults()
	p, err := worker.New(store, map[string]worker.Agent{"payer": r.agent},
		worker.Options{ClaimInterval: 5 * time.Millisecond, RetryAfter: time.Hour, Done: res.done})
	if err != nil {
		t.Fatal(err)
	}
	submit(t, p, 1)
	r.failBuild.Store(true)
	stop := work(t, p)
	defer stop()
	waitFor(t, "the failure recorded", func() bool {
		info, _ := store.Describe(context.Background(), "run-000")
		return info.Failures == 1
	})
	info, _ := store.Describe(context.Background(), "run-000")
	if !strings.Contains(info.LastError, "the agent's configuration is missing") || time.Until(info.RetryAt) < 50*time.Minute || info.Status != seams.StatusAwaiting {
		t.Fatalf("after the failure: %+v, want the error, a retry an hour away, awaiting", info)
	}
	builds := r.builds.Load()
	time.Sleep(50 * time.Millisecond)
	if r.builds.Load() != builds {
		t.Fatalf("the run was claimed again during its back-off")
	}
	r.failBuild.Store(false)
	if err := p.Resume(context.Background(), "run-000"); err != nil {
		t.Fatal(err)
	}
	res.waitFinished(t, 1)
	if got := res.runs["run-000"]; got.StopReason != events.StopAgentFinished {
		t.Fatalf("after Resume: %+v", got)
	}
}

// TestCancelThroughThePoolEndsTheRunCancelled: an operator's Cancel of a
// run the pool drives ends it cancelled before its next payment.
func TestCancelThroughThePoolEndsTheRunCancelled(t *testing.T) {
	store := &seamstest.MemStore{}
	r, res := newRig(5), newResults()
	r.gate = make(chan struct{})
	p, err := worker.New(store, map[string]worker.Agent{"payer": r.agent}, worker.Options{ClaimInterval: 5 * time.Millisecond, Done: res.done})
	if err != nil {
		t.Fatal(err)
	}
	submit(t, p, 1)
	stop := work(t, p)
	defer stop()
	waitFor(t, "the first payment", func() bool {
		info, _ := store.Describe(context.Background(), "run-000")
		return info.Events >= 4
	})
	c, err := p.Cancel(context.Background(), "run-000", "ops")
	if err != nil || c.Holder == "" {
		t.Fatalf("Cancel: %+v %v, want the holder to end the run", c, err)
	}
	close(r.gate)
	res.waitFinished(t, 1)
	if got := res.runs["run-000"]; got.StopReason != events.StopCancelled || len(r.executions) != 1 {
		t.Fatalf("%s after %d payments, want cancelled after the one in progress", got.StopReason, len(r.executions))
	}
}

// TestAPoolRefusesWhatItCannotUse: a store that hands out no runs, no
// agents, a bad agent name, an unknown agent at Submit.
func TestAPoolRefusesWhatItCannotUse(t *testing.T) {
	r := newRig(1)
	if _, err := worker.New(plainStore{}, map[string]worker.Agent{"a": r.agent}, worker.Options{}); err == nil || !strings.Contains(err.Error(), "seams.RunQueue") {
		t.Errorf("a store without a queue: %v", err)
	}
	if _, err := worker.New(&seamstest.MemStore{}, nil, worker.Options{}); err == nil || !strings.Contains(err.Error(), "no agents") {
		t.Errorf("no agents: %v", err)
	}
	if _, err := worker.New(&seamstest.MemStore{}, map[string]worker.Agent{"a\x00": r.agent}, worker.Options{}); !errors.Is(err, seams.ErrInvalidAgent) {
		t.Errorf("a bad agent name: %v", err)
	}
	p, err := worker.New(&seamstest.MemStore{}, map[string]worker.Agent{"payer": r.agent}, worker.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Submit(context.Background(), "refunder", "r", nil); !errors.Is(err, worker.ErrUnknownAgent) || !strings.Contains(err.Error(), `"refunder"`) {
		t.Errorf("an unknown agent: %v", err)
	}
}

type plainStore struct{ seams.RunStore }

// TestAWorkerSaysWhyItClaimsNothing: a pool on a store it cannot claim
// from (read-only) reports each failed claim to Options.Problem instead of
// idling in silence.
func TestAWorkerSaysWhyItClaimsNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runs.db")
	s, err := kv.Open(path, kv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	ro, err := kv.Open(path, kv.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	problems := make(chan error, 100)
	p, err := worker.New(ro, map[string]worker.Agent{"payer": newRig(1).agent}, worker.Options{ClaimInterval: 5 * time.Millisecond,
		Problem: func(err error) { problems <- err }})
	if err != nil {
		t.Fatal(err)
	}
	stop := work(t, p)
	defer stop()
	select {
	case err := <-problems:
		if !strings.Contains(err.Error(), "claim runs") || !strings.Contains(err.Error(), "read-only") {
			t.Fatalf("reported %v, want the failed claim and why", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no problem reported")
	}
	if err := p.Work(context.Background()); !errors.Is(err, worker.ErrWorking) {
		t.Fatalf("a second Work: %v, want ErrWorking", err)
	}
}

// TestARunAwaitingADecisionIsParkedUntilTheDecision: a worker that finds
// its run waiting for a person gives it back without counting a failure,
// and no worker claims it again until the decision hands it back; then
// the approved payment is made once and the run finishes.
func TestARunAwaitingADecisionIsParkedUntilTheDecision(t *testing.T) {
	for name, open := range map[string]func(t *testing.T) seams.RunStore{
		"memstore": func(*testing.T) seams.RunStore { return &seamstest.MemStore{} },
		"kv": func(t *testing.T) seams.RunStore {
			s, err := kv.Open(filepath.Join(t.TempDir(), "runs.db"), kv.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
	} {
		t.Run(name, func(t *testing.T) {
			store := open(t)
			r, res := newRig(1), newResults()
			r.approval = true
			awaiting := make(chan *engine.AwaitingError, 16)
			done := func(runID string, result events.RunResult, err error) {
				var a *engine.AwaitingError
				if errors.As(err, &a) {
					select {
					case awaiting <- a:
					default: // claimed again and again: the test fails on the builds
					}
				}
				res.done(runID, result, err)
			}
			p, err := worker.New(store, map[string]worker.Agent{"payer": r.agent},
				worker.Options{ClaimInterval: 5 * time.Millisecond, DecisionRecheck: time.Hour, Done: done})
			if err != nil {
				t.Fatal(err)
			}
			submit(t, p, 3)
			stop := work(t, p)
			defer stop()
			var pending []*engine.AwaitingError
			for range 3 {
				select {
				case a := <-awaiting:
					pending = append(pending, a)
				case <-time.After(30 * time.Second):
					t.Fatalf("runs did not come to await a decision; errors so far: %v", res.errs)
				}
			}
			builds := r.builds.Load()
			time.Sleep(100 * time.Millisecond) // twenty claim intervals
			if got := r.builds.Load(); got != builds {
				t.Fatalf("a run awaiting a decision was claimed again %d times before any decision", got-builds)
			}
			for _, a := range pending {
				info, err := store.(seams.RunDescriber).Describe(context.Background(), a.RunID)
				if err != nil || info.Failures != 0 {
					t.Fatalf("%s parked: %+v, %v; want no failure counted", a.RunID, info, err)
				}
				if _, err := engine.Decide(context.Background(), store, events.Decision{RunID: a.RunID, ResultID: a.Calls[0].Call,
					Verdict: events.VerdictApproved, By: "ana"}); err != nil {
					t.Fatalf("approve %s: %v", a.RunID, err)
				}
			}
			res.waitFinished(t, 3)
			if len(r.executions) != 3 || len(r.twice()) > 0 {
				t.Fatalf("%d payments, %v twice; want 3, each once", len(r.executions), r.twice())
			}
		})
	}
}

// decidingStore is a kv store where a person approves a run's pending call
// at the worst moment: after the worker's drive found the run awaiting and
// let go of it, before the worker parks it (its ReleaseRun with a retry).
type decidingStore struct {
	*kv.Store
	decided atomic.Int64
}

func (s *decidingStore) ReleaseRun(ctx context.Context, runID, failure string, retry time.Duration) error {
	if failure == "" && retry > 0 {
		stream, err := s.Load(ctx, runID)
		v, err := recovery.ClassifyLoaded(runID, stream, err)
		if err == nil && v.Pending != nil {
			if _, err := engine.Decide(ctx, s.Store, events.Decision{RunID: runID, ResultID: v.Pending.Call, Verdict: events.VerdictApproved, By: "ana"}); err == nil {
				s.decided.Add(1)
			}
		}
	}
	return s.Store.ReleaseRun(ctx, runID, failure, retry)
}

// TestADecisionJustBeforeTheWorkerParksTheRunIsNotLost: a decision
// recorded after the worker found the run awaiting but before it parked
// it (Decide's hand-back then comes first, the park after) leaves the run
// to be driven at once, not parked until DecisionRecheck.
func TestADecisionJustBeforeTheWorkerParksTheRunIsNotLost(t *testing.T) {
	inner, err := kv.Open(filepath.Join(t.TempDir(), "runs.db"), kv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	store := &decidingStore{Store: inner}
	r, res := newRig(1), newResults()
	r.approval = true
	p, err := worker.New(store, map[string]worker.Agent{"payer": r.agent},
		worker.Options{ClaimInterval: 5 * time.Millisecond, DecisionRecheck: time.Hour, Done: res.done})
	if err != nil {
		t.Fatal(err)
	}
	submit(t, p, 3)
	stop := work(t, p)
	defer stop()
	res.waitFinished(t, 3)
	if store.decided.Load() != 3 || len(r.executions) != 3 || len(r.twice()) > 0 {
		t.Fatalf("%d decided before the park, %d payments, %v twice; want 3, 3, none", store.decided.Load(), len(r.executions), r.twice())
	}
}
