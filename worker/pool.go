// Package worker keeps a store's runs alive: a Pool submits runs of named
// agents and drives the runs it claims from the store, including those a
// dead worker left behind, until it is told to stop.
//
// A consumer registers its agents by name — an Agent builds the
// engine.Definition and engine.Request of one run from the run's id and
// input — and starts Work on a store that hands runs to workers
// (seams.RunQueue: kv.Store, pgstore.Store). Submit makes a run durable
// (its RunStarted, with the agent's name and the input) and returns at
// once; any pool with that agent claims it and drives it with
// engine.Resume, so a run whose worker died (its lease ran out, or on a
// bbolt file the process that held it is gone) is claimed by another
// worker and continued by the recovery table: a side effect in doubt is
// made again when its policy is safe, and the run ends
// resume_state_unknown when it is never, exactly as Resume does.
//
// Stopping a worker is not cancelling its runs. When Work's context ends,
// every run the pool drives stops at its next step boundary
// (engine.Definition.Interrupt): the step in progress completes, nothing
// is in doubt, the run stays unfinished, and the pool gives it back to the
// store (seams.RunQueue.ReleaseRun) so another worker takes it at once.
// Cancelling a run stays what it is: Cancel (engine.Cancel) records an
// operator's request the driving worker sees before its next side effect,
// and the run ends cancelled. Resume hands a run back to the workers now.
//
// A run whose drive fails — its agent could not build it, its parameters
// changed with a deploy (engine.ErrParametersChanged), the store failed —
// is given back with the failure recorded and claimed again after a
// back-off that doubles with each failure (Options.RetryAfter up to
// Options.MaxRetryAfter); an operator's Resume clears it.
//
// A run that waits for a person (engine.ErrAwaitingDecision: an action
// awaiting approval, or an outcome in doubt awaiting an operator's
// finding) is no failure: it is parked — given back with no failure
// counted, not claimed again for Options.DecisionRecheck — and handed back
// at once by the decision (engine.Decide, engine.Resolve).
//
// What a run is for — which runs to submit, in what order, what their
// results mean — stays with the consumer: the pool only keeps the runs it
// is given alive.
package worker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
)

// Agent builds the definition and request of one run of an agent from the
// run's id and its input (what Submit was given). It is called once when
// the run is submitted and again by every worker that claims it, so it
// must build the same run each time: Resume refuses a run whose
// parameters changed (engine.ErrParametersChanged), and the pool then
// records the failure. The pool sets Definition.Store,
// Definition.Interrupt, Request.RunID, Request.Agent and Request.Input;
// what the agent sets there is replaced.
type Agent func(ctx context.Context, runID string, input []byte) (engine.Definition, engine.Request, error)

// Options tune a Pool. Zero fields take the defaults below.
type Options struct {
	// Concurrency bounds the runs the pool drives at once.
	Concurrency int
	// ClaimInterval is how long the pool waits between looks for
	// claimable runs while it has room and finds none. A dead worker's
	// runs are taken over within their lease's expiry plus one interval.
	ClaimInterval time.Duration
	// RetryAfter is how long a run whose drive failed waits before it is
	// claimed again; each further failure doubles it, up to MaxRetryAfter.
	RetryAfter    time.Duration
	MaxRetryAfter time.Duration
	// DecisionRecheck is how long a run that waits for a person's decision
	// (engine.ErrAwaitingDecision) is left unclaimed once a worker found
	// it waiting; not a failure. engine.Decide and engine.Resolve hand the
	// run back at once, so this only bounds how late a decision recorded
	// some other way is noticed.
	DecisionRecheck time.Duration
	// Done, when set, is called as each drive ends: with the run's result
	// when it finished (err nil), or with the error that stopped it
	// (engine.ErrInterrupted at shutdown, engine.ErrRunBusy when another
	// driver had it, an *engine.AwaitingError when it waits for a person's
	// decision, or the failure the pool recorded). It is called from
	// each run's goroutine, so concurrently; the run's slot is free only
	// once it returns.
	Done func(runID string, result events.RunResult, err error)
	// Problem, when set, is called with each failure of the pool's own
	// work: a claim that failed (a read-only or closed store, a database
	// out of reach; the pool tries again after ClaimInterval) or a run
	// that could not be given back (its hold runs out instead). Called
	// from Work's goroutine or a run's, so concurrently.
	Problem func(err error)
}

// claimGather is how long the pool waits, after a Submit through it or a
// run's end, for more of them before it claims.
const claimGather = 10 * time.Millisecond

// Defaults of Options.
const (
	DefaultConcurrency     = 64
	DefaultClaimInterval   = time.Second
	DefaultRetryAfter      = time.Second
	DefaultMaxRetryAfter   = 5 * time.Minute
	DefaultDecisionRecheck = 5 * time.Minute
)

func (o Options) withDefaults() Options {
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.ClaimInterval <= 0 {
		o.ClaimInterval = DefaultClaimInterval
	}
	if o.RetryAfter <= 0 {
		o.RetryAfter = DefaultRetryAfter
	}
	if o.MaxRetryAfter <= 0 {
		o.MaxRetryAfter = DefaultMaxRetryAfter
	}
	if o.DecisionRecheck <= 0 {
		o.DecisionRecheck = DefaultDecisionRecheck
	}
	if o.MaxRetryAfter < o.RetryAfter {
		o.MaxRetryAfter = o.RetryAfter
	}
	return o
}

// Pool submits and drives runs of its agents on one store. Its methods are
// safe for concurrent use; Work runs once at a time.
type Pool struct {
	store  seams.RunStore
	queue  seams.RunQueue
	agents map[string]Agent
	names  []string
	opts   Options
	wake   chan struct{}

	mu      sync.Mutex
	working bool
}

// Errors of a Pool.
var (
	// ErrUnknownAgent: Submit was given an agent the pool does not know.
	ErrUnknownAgent = errors.New("worker: unknown agent")
	// ErrWorking: Work was called on a pool that is already working.
	ErrWorking = errors.New("worker: this pool is already working")
)

// New returns a pool of agents on store, which must hand runs to workers
// (seams.RunQueue). Agent names follow seams.ValidAgent.
func New(store seams.RunStore, agents map[string]Agent, opts Options) (*Pool, error) {
	q, ok := store.(seams.RunQueue)
	if !ok {
		return nil, fmt.Errorf("worker: the store (%T) does not hand runs to workers (seams.RunQueue)", store)
	}
	if len(agents) == 0 {
		return nil, errors.New("worker: no agents: a pool needs at least one to claim runs for")
	}
	for name, a := range agents {
		if err := seams.ValidAgent(name); err != nil {
			return nil, fmt.Errorf("worker: %w", err)
		}
		if a == nil {
			return nil, fmt.Errorf("worker: agent %q is nil", name)
		}
	}
	return &Pool{store: store, queue: q, agents: maps.Clone(agents), names: slices.Sorted(maps.Keys(agents)),
		opts: opts.withDefaults(), wake: make(chan struct{}, 1)}, nil
}

// Submit makes the run runID of agent durable — its RunStarted, recording
// the agent and input — and returns that event without driving the run:
// a worker with the agent claims it (this pool at once when it works).
// It fails with ErrUnknownAgent, with the agent's error, and as
// engine.Start fails (engine.ErrRunExists for a run id in use).
func (p *Pool) Submit(ctx context.Context, agent, runID string, input []byte) (events.Envelope, error) {
	def, req, err := p.build(ctx, agent, runID, input, nil)
	if err != nil {
		return events.Envelope{}, err
	}
	env, err := engine.Start(ctx, def, req)
	if err != nil {
		return events.Envelope{}, err
	}
	p.poke()
	return env, nil
}

// build calls agent's builder and sets what the pool owns.
func (p *Pool) build(ctx context.Context, agent, runID string, input []byte, stop <-chan struct{}) (engine.Definition, engine.Request, error) {
	a, ok := p.agents[agent]
	if !ok {
		return engine.Definition{}, engine.Request{}, fmt.Errorf("%w %q (the pool knows %q)", ErrUnknownAgent, agent, p.names)
	}
	def, req, err := a(ctx, runID, input)
	if err != nil {
		return engine.Definition{}, engine.Request{}, fmt.Errorf("worker: agent %q building run %q: %w", agent, runID, err)
	}
	def.Store, def.Interrupt = p.store, stop
	req.RunID, req.Agent, req.Input = runID, agent, input
	return def, req, nil
}

// poke wakes Work to claim now.
func (p *Pool) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Cancel asks for the run runID to be cancelled, by an operator named by
// (engine.Cancel): the worker driving it, in any process, ends it before
// its next side effect; a run nobody drives is ended at once.
func (p *Pool) Cancel(ctx context.Context, runID, by string) (engine.Cancellation, error) {
	return engine.Cancel(ctx, p.store, runID, by)
}

// Resume hands the interrupted run runID back to the workers now
// (seams.RunQueue.RequeueRun): its back-off and failures are cleared, and
// this pool looks for it at once when it works.
func (p *Pool) Resume(ctx context.Context, runID string) error {
	if err := p.queue.RequeueRun(ctx, runID); err != nil {
		return fmt.Errorf("worker: resume run %q: %w", runID, err)
	}
	p.poke()
	return nil
}

// Work claims and drives runs of the pool's agents until ctx ends: up to
// Options.Concurrency at once, looking for claimable runs every
// Options.ClaimInterval (at once after a Submit or Resume through this
// pool, or when a run ends). When ctx ends it claims nothing more,
// interrupts every run it drives at its next step boundary, gives each
// back to the store, and returns nil once all have stopped; runs are
// never cancelled by it (their contexts carry ctx's values, not its
// cancellation). A step in progress is waited for. A claim that fails is
// reported to Options.Problem and tried again; Work returns an error only
// for a second Work on the same pool (ErrWorking).
func (p *Pool) Work(ctx context.Context) error {
	p.mu.Lock()
	if p.working {
		p.mu.Unlock()
		return ErrWorking
	}
	p.working = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.working = false
		p.mu.Unlock()
	}()

	stop := make(chan struct{})
	runCtx := context.WithoutCancel(ctx)
	done := make(chan struct{}, p.opts.Concurrency)
	var wg sync.WaitGroup
	active := 0
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		if free := p.opts.Concurrency - active; free > 0 && ctx.Err() == nil {
			// A claim that fails (the server restarting, say) is tried
			// again after the interval: what it would have claimed stays
			// claimable. It is not cut short by ctx: runs a claim took
			// are driven, and given back at once if ctx ended meanwhile.
			cctx, cancel := context.WithTimeout(runCtx, 30*time.Second)
			claims, err := p.queue.ClaimRuns(cctx, p.names, free)
			cancel()
			if err != nil {
				p.problem(fmt.Errorf("worker: claim runs: %w", err))
			}
			for _, c := range claims {
				active++
				wg.Add(1)
				go func() {
					defer wg.Done()
					p.drive(runCtx, c, stop)
					done <- struct{}{}
				}()
			}
		}
		timer.Reset(p.opts.ClaimInterval)
		select {
		case <-ctx.Done():
			close(stop)
			wg.Wait()
			return nil
		case <-done:
			active--
		case <-p.wake:
		case <-timer.C:
			continue
		}
		// Submits and runs ending close together make one claim: a claim
		// is a write (on a bbolt file, a commit of its own), and one per
		// submitted or finished run would crowd out the runs' appends.
		gather := time.NewTimer(claimGather)
		for gathering := true; gathering; {
			select {
			case <-done:
				active--
			case <-p.wake:
			case <-gather.C:
				gathering = false
			case <-ctx.Done():
				gather.Stop()
				gathering = false
			}
		}
	}
}

// drive drives one claimed run with engine.Resume and settles what
// becomes of it.
func (p *Pool) drive(ctx context.Context, c seams.Claim, stop <-chan struct{}) {
	res, err := p.resume(ctx, c, stop)
	switch {
	case err == nil, errors.Is(err, engine.ErrRunBusy), errors.Is(err, engine.ErrRunNotFound):
		// Finished; or another driver has the run (taking it ended the
		// claim: the run is that driver's, and nobody's once it lets go);
		// or it was deleted.
	case errors.Is(err, engine.ErrInterrupted):
		err = p.release(ctx, c.RunID, "", 0, err)
	case errors.Is(err, engine.ErrAwaitingDecision):
		// Waiting for a person is not a failure; nothing to claim until
		// the decision hands the run back.
		err = p.release(ctx, c.RunID, "", p.opts.DecisionRecheck, err)
		p.unparkIfDecided(ctx, c.RunID)
	default:
		err = p.release(ctx, c.RunID, err.Error(), p.backoff(ctx, c.RunID), err)
	}
	if p.opts.Done != nil {
		p.opts.Done(c.RunID, res, err)
	}
}

func (p *Pool) resume(ctx context.Context, c seams.Claim, stop <-chan struct{}) (events.RunResult, error) {
	started, err := firstEvent(ctx, p.store, c.RunID)
	if err != nil {
		return events.RunResult{}, err
	}
	def, req, err := p.build(ctx, c.Agent, c.RunID, started.Input, stop)
	if err != nil {
		return events.RunResult{}, err
	}
	return engine.Resume(ctx, def, req)
}

// release gives the run back to the store; cause is what stopped its
// drive, returned with the release's own failure joined to it.
func (p *Pool) release(ctx context.Context, runID, failure string, retry time.Duration, cause error) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.queue.ReleaseRun(ctx, runID, failure, retry); err != nil {
		err = fmt.Errorf("worker: give back run %q: %w (its hold runs out instead)", runID, err)
		p.problem(err)
		return errors.Join(cause, err)
	}
	return cause
}

// unparkIfDecided hands back at once a run the pool just parked for a
// person's decision when the decision came first: Decide's hand-back
// (RunQueue.RequeueRun) may land between the drive's end and the park,
// which would otherwise hide the decided run until DecisionRecheck.
func (p *Pool) unparkIfDecided(ctx context.Context, runID string) {
	stream, err := p.store.Load(ctx, runID)
	v, err := recovery.ClassifyLoaded(runID, stream, err)
	if err != nil || v.Pending != nil || v.State == recovery.Finished {
		return // still waiting, finished, or for the next drive to report
	}
	if err := p.queue.RequeueRun(ctx, runID); err != nil && !errors.Is(err, seams.ErrRunLocked) && !errors.Is(err, seams.ErrRunFinished) {
		p.problem(fmt.Errorf("worker: hand back decided run %q: %w (it waits for DecisionRecheck instead)", runID, err))
	}
}

// problem reports a failure of the pool's own work (Options.Problem).
func (p *Pool) problem(err error) {
	if p.opts.Problem != nil {
		p.opts.Problem(err)
	}
}

// backoff is how long the run waits after one more failure: RetryAfter,
// doubled for each failure recorded before, at most MaxRetryAfter.
func (p *Pool) backoff(ctx context.Context, runID string) time.Duration {
	failures := 0
	if d, ok := p.store.(seams.RunDescriber); ok {
		if info, err := d.Describe(ctx, runID); err == nil {
			failures = info.Failures
		}
	}
	wait := p.opts.RetryAfter
	for range min(failures, 30) {
		wait *= 2
		if wait >= p.opts.MaxRetryAfter {
			return p.opts.MaxRetryAfter
		}
	}
	return wait
}

// errFirst stops a scan at the first event.
var errFirst = errors.New("first event read")

// firstEvent reads the run's RunStarted: the first event alone from a
// store that hands a stream over event by event, else from its Load.
func firstEvent(ctx context.Context, store seams.RunStore, runID string) (events.RunStarted, error) {
	var first *events.Envelope
	keep := func(env events.Envelope) error {
		first = &env
		return errFirst
	}
	var err error
	if sc, ok := store.(seams.RunScanner); ok {
		err = sc.Scan(ctx, runID, keep)
	} else {
		var stream []events.Envelope
		stream, err = store.Load(ctx, runID)
		if len(stream) > 0 {
			err = keep(stream[0])
		}
	}
	switch {
	case first == nil && err == nil:
		return events.RunStarted{}, fmt.Errorf("worker: run %q: %w", runID, engine.ErrRunNotFound)
	case first == nil:
		return events.RunStarted{}, fmt.Errorf("worker: read run %q: %w", runID, err)
	}
	started, ok := events.As[events.RunStarted](first.Event)
	if !ok {
		return events.RunStarted{}, fmt.Errorf("worker: run %q begins with %s, not run_started: %w", runID, first.Kind, events.ErrCorruption)
	}
	return started, nil
}
