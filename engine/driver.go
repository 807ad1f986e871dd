package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
)

// Run starts the run req.RunID and drives it until it stops. Its error is
// for infrastructure only (an invalid definition or request, a store
// failure, a cancelled run whose RunFinished could not be written within the
// grace); every way the loop itself stops is a RunResult with a stop reason.
// Run fails with ErrRunExists when the run id already has a log, before
// writing anything, and also when another driver holds the run id (the
// error then matches ErrRunBusy too): a driver holds a run id only for a
// run that exists or that it is starting, since Resume takes it only once
// it has seen the run's log.
func Run(ctx context.Context, def Definition, req Request) (events.RunResult, error) {
	cfg, err := prepare(def, req)
	if err != nil {
		return events.RunResult{}, err
	}
	release, err := lockRun(def.Store, req.RunID)
	if errors.Is(err, ErrRunBusy) {
		return events.RunResult{}, fmt.Errorf("engine: run %q: %w: %w", req.RunID, ErrRunExists, err)
	}
	if err != nil {
		return events.RunResult{}, err
	}
	existing, err := def.Store.Load(ctx, req.RunID)
	if err != nil {
		release()
		return events.RunResult{}, fmt.Errorf("engine: load run %q: %w", req.RunID, err)
	}
	if len(existing) > 0 {
		release()
		exists := fmt.Errorf("engine: run %q: %w", req.RunID, ErrRunExists)
		// A store whose reservations live on the run's own record (pgstore's
		// leases) reserved a run that had none yet; another driver started
		// it since. Asking again tells whether that driver holds it now.
		again, err := lockRun(def.Store, req.RunID)
		if errors.Is(err, ErrRunBusy) {
			return events.RunResult{}, fmt.Errorf("%w: %w", exists, err)
		}
		if err == nil {
			again()
		}
		return events.RunResult{}, exists
	}
	defer release()
	return newDriver(def, req, ulid.ULID{}).drive(ctx, newMachine(cfg))
}

// Start makes the run req.RunID durable — its RunStarted, with the
// request's Agent and Input — and returns that event without driving the
// run: Resume, or a worker that claims the run, drives it. It fails as
// Run fails before it writes. A run that would stop before its first
// model call (a prompt over its budget) is finished by Start. ctx bounds
// Start until it writes; the write is not abandoned once begun (a run
// whose context ended meanwhile is written, not finished cancelled).
//
// Start reserves nothing and reads nothing: it executes nothing, so there
// is nothing to spare a second driver, and its one append is refused,
// writing nothing, when the run id has a log (the store's start rule):
// the error then matches ErrRunExists.
func Start(ctx context.Context, def Definition, req Request) (events.Envelope, error) {
	stop := make(chan struct{})
	close(stop)
	def.Interrupt = stop
	cfg, err := prepare(def, req)
	if err != nil {
		return events.Envelope{}, err
	}
	if err := ctx.Err(); err != nil {
		return events.Envelope{}, fmt.Errorf("engine: start run %q: %w", req.RunID, context.Cause(ctx))
	}
	d := newDriver(def, req, ulid.ULID{})
	// Start holds nothing: a cancel request that comes as it writes is
	// carried out by whoever takes the run (Cancel itself, or a worker).
	d.holdsNothing = true
	if _, err := d.drive(context.WithoutCancel(ctx), newMachine(cfg)); err != nil && !errors.Is(err, ErrInterrupted) {
		return events.Envelope{}, err
	}
	return d.started, nil
}

// lockRun reserves runID for this driver when the store can (seams.RunLocker).
func lockRun(store seams.RunStore, runID string) (func(), error) {
	l, ok := store.(seams.RunLocker)
	if !ok {
		return func() {}, nil
	}
	release, err := l.LockRun(runID)
	if errors.Is(err, seams.ErrRunLocked) {
		return nil, fmt.Errorf("%w: %w", ErrRunBusy, err)
	}
	if err != nil {
		return nil, fmt.Errorf("engine: reserve run %q: %w", runID, err)
	}
	return release, nil
}

// prepare validates everything and builds the run's fixed configuration.
// It does no I/O beyond asking the seams for their parameters.
func prepare(def Definition, req Request) (*config, error) {
	if err := def.validate(); err != nil {
		return nil, err
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	snap, err := snapshot(def, req)
	if err != nil {
		return nil, err
	}
	cfg := &config{
		runID: req.RunID, budget: req.Budget.withDefaults(), modelPolicy: req.ModelReplayPolicy,
		obsTemplate: req.observationTemplate(), synthetic: def.Synthetic.withDefaults(),
		parser: def.Parser, tools: req.Tools, binding: req.ModelBinding, snapshot: snap,
		agent: req.Agent, input: slices.Clone(req.Input),
	}
	if !isNil(req.Approval) {
		cfg.approval = req.Approval
	}
	cfg.prefix = promptPrefix(req)
	for _, msg := range cfg.prefix {
		cfg.prefixChars += messageChars(msg)
	}
	return cfg, nil
}

// promptPrefix is the stable part of every prompt, in the order that lets
// provider prefix caching work: run-level messages, injections (channels
// sorted, entries in order, each a system message), the tool section
// (omitted without tools), goal-level messages.
func promptPrefix(req Request) []seams.Message {
	out := slices.Clone(req.Context.RunLevel)
	for _, ch := range slices.Sorted(maps.Keys(req.Injections)) {
		for _, inj := range req.Injections[ch] {
			out = append(out, seams.Text(seams.RoleSystem, inj.Content))
		}
	}
	if req.Tools != nil && len(req.Tools.Names()) > 0 {
		section := strings.Replace(req.toolSectionTemplate(), "{tools}", req.Tools.SchemaForModel(), 1)
		out = append(out, seams.Text(seams.RoleSystem, section))
	}
	return append(out, req.Context.GoalLevel...)
}

// driver carries out the machine's commands: durable appends, model calls,
// actions, sink delivery. It owns the clock and the id source.
type driver struct {
	def      Definition
	req      Request
	ids      *events.IDSource
	failures int
	// tail is the id of the stream's last event as this driver knows it:
	// every append names it, so a driver whose tail another writer moved
	// fails its next append and stops.
	tail ulid.ULID
	// holdsNothing: the driver writes a run it has not reserved (Start),
	// and leaves cancel requests to whoever takes the run.
	holdsNothing bool
	// started is the run's RunStarted when this driver wrote it.
	started events.Envelope
	// cancelRun cancels the run's context (drive sets it).
	cancelRun context.CancelCauseFunc
}

// newDriver returns a driver continuing the stream from tail (zero for a
// new run), with its own id source: result ids are ULIDs, increasing within
// the run and, with 80 random bits each, unique across runs.
func newDriver(def Definition, req Request, tail ulid.ULID) *driver {
	return &driver{def: def, req: req.withDefaults(), ids: new(events.IDSource), tail: tail}
}

func (d *driver) observe(ctx context.Context, in input) input {
	in.at = time.Now()
	in.freshID = d.ids.Next(in.at).String()
	d.cancelIfRequested(ctx)
	in.cancelled = ctx.Err() != nil
	in.interrupted = d.interrupted()
	in.failures = d.failures
	return in
}

// interrupted reports whether Definition.Interrupt is closed.
func (d *driver) interrupted() bool {
	select {
	case <-d.def.Interrupt:
		return true
	default:
		return false
	}
}

// cancelIfRequested cancels the run's context when an operator asked the
// store to cancel the run (seams.RunCanceller): the run then ends as a
// cancelled context ends it, its appends still owed getting the grace. A
// store that cannot tell leaves the run as it is: what it did not see, it
// sees at the next input.
func (d *driver) cancelIfRequested(ctx context.Context) {
	if d.cancelRun == nil || d.holdsNothing || ctx.Err() != nil {
		return
	}
	c, ok := d.def.Store.(seams.RunCanceller)
	if !ok {
		return
	}
	if r, err := c.CancelRequested(ctx, d.req.RunID); err == nil && r != nil {
		d.cancelRun(fmt.Errorf("%w by %q at %s", ErrCancelRequested, r.By, r.At.UTC().Format(time.RFC3339)))
	}
}

// drive runs the machine from inBegin until it is done.
func (d *driver) drive(ctx context.Context, m *machine) (events.RunResult, error) {
	// An operator's request through the store cancels the run as its
	// context's cancellation would (cancelIfRequested).
	ctx, d.cancelRun = context.WithCancelCause(ctx)
	defer d.cancelRun(nil)
	// Appends get a context of their own, made once per run (see append).
	wctx, release := graceContext(ctx, d.req.cancelGrace())
	defer release()
	in := input{kind: inBegin}
	for {
		// A call or action a resumed run's first command asks for is
		// one its log's tail left without a result: a replay, which the
		// sink learns of through the context of the emits that follow.
		replay := in.kind == inBegin && d.tail != (ulid.ULID{})
		cmd := m.step(d.observe(ctx, in))
		switch cmd.kind {
		case cmdAppend:
			envs, err := d.append(ctx, wctx, cmd.events)
			if err != nil {
				return events.RunResult{}, err
			}
			in = input{kind: inAppended, envs: envs}
		case cmdCallModel:
			if err := d.holds(wctx, "calling the model"); err != nil {
				return events.RunResult{}, err
			}
			if replay {
				wctx = seams.WithReplay(wctx, seams.Replay{ResultID: cmd.model.ResultID, At: time.Now()})
			}
			reply, err := d.callModel(ctx, cmd.model)
			in = input{kind: inModelReturned, reply: reply, err: err}
		case cmdExecute:
			if err := d.holds(wctx, "executing the action of step "+strconv.Itoa(cmd.action.StepIdx)); err != nil {
				return events.RunResult{}, err
			}
			if replay {
				wctx = seams.WithReplay(wctx, seams.Replay{ResultID: cmd.action.ResultID, At: time.Now()})
			}
			out, err := d.execute(ctx, cmd.action)
			in = input{kind: inActionReturned, outcome: out, err: err}
		case cmdInterrupted:
			return events.RunResult{}, fmt.Errorf("engine: run %q stopped after %d steps: %w", d.req.RunID, len(m.fold().Steps), ErrInterrupted)
		case cmdAwait:
			return events.RunResult{}, &AwaitingError{RunID: d.req.RunID, Calls: []recovery.PendingCall{*cmd.pending}}
		case cmdDone:
			// The stored result, as it is: Resume and the projections
			// read the same value.
			return cmd.result, nil
		default:
			return events.RunResult{}, fmt.Errorf("engine: internal error: %s", cmd.err)
		}
	}
}

// append makes evs durable — in one transaction, or one per event when
// coalescing is off — each naming the tail it continues, and delivers each
// event to the sink once durable.
//
// An append is never abandoned because the run was cancelled: the events
// may record a side effect that already happened (the outcome of an action,
// a model reply), and losing them would turn a known outcome into one in
// doubt. The store therefore gets wctx, a context detached from the run's
// ctx that ends CancelGrace after ctx does, whether the append was queued,
// in flight or not yet started when the cancellation came.
func (d *driver) append(ctx, wctx context.Context, evs []events.Event) ([]events.Envelope, error) {
	groups := [][]events.Event{evs}
	if d.req.OneEventPerTransaction {
		groups = groups[:0]
		for _, ev := range evs {
			groups = append(groups, []events.Event{ev})
		}
	}
	var out []events.Envelope
	for _, g := range groups {
		envs, err := d.def.Store.Append(wctx, d.req.RunID, d.tail, g...)
		switch {
		case err == nil:
		case errors.Is(err, seams.ErrTailMoved):
			return nil, fmt.Errorf("%w: run %q: appending %s, its tail had moved; this driver stopped and executes nothing more: %w",
				ErrRunBusy, d.req.RunID, kinds(g), err)
		case errors.Is(err, seams.ErrRunExists):
			// Another driver started the run between this one's look at
			// its log and its first append (two workers starting one run
			// on a store whose reservation a run without a log cannot
			// carry): it is that driver's.
			return nil, fmt.Errorf("%w: run %q: another driver started it meanwhile; this driver executed nothing: %w",
				ErrRunBusy, d.req.RunID, err)
		case errors.Is(err, seams.ErrRunLocked):
			return nil, fmt.Errorf("%w: run %q: appending %s, the run was no longer this driver's; it stopped and executes nothing more: %w",
				ErrRunBusy, d.req.RunID, kinds(g), err)
		case ctx.Err() != nil && wctx.Err() != nil:
			return nil, fmt.Errorf("engine: run %q was cancelled and its %s could not be made durable within the cancel grace of %s (the run can be resumed): %w (store: %w)",
				d.req.RunID, kinds(g), d.req.cancelGrace(), context.Cause(wctx), err)
		default:
			return nil, fmt.Errorf("engine: append %s to run %q: %w", kinds(g), d.req.RunID, err)
		}
		if d.tail == (ulid.ULID{}) {
			d.started = envs[0]
		}
		d.tail = envs[len(envs)-1].ID
		for _, env := range envs {
			d.emit(wctx, env)
		}
		if out == nil {
			out = envs[:len(envs):len(envs)] // one group, the usual case: no copy
		} else {
			out = append(out, envs...)
		}
	}
	return out, nil
}

// holds makes sure, before a model call or a side effect, that this
// driver still holds its run when the store's reservations are leases that
// can be lost (seams.RunLeaser): a driver paused past its lease (a stopped
// process, a partition) may find another driving the run when it wakes,
// and then stops, calling and executing nothing more.
func (d *driver) holds(ctx context.Context, before string) error {
	l, ok := d.def.Store.(seams.RunLeaser)
	if !ok {
		return nil
	}
	err := l.HoldsRun(ctx, d.req.RunID)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, seams.ErrRunLocked):
		return fmt.Errorf("%w: run %q: before %s, the run was no longer this driver's; it stopped and executes nothing more: %w",
			ErrRunBusy, d.req.RunID, before, err)
	}
	return fmt.Errorf("engine: run %q: before %s, this driver could not make sure it still holds the run, so it stopped and executes nothing more (the run can be resumed): %w",
		d.req.RunID, before, err)
}

// graceContext returns a context that carries ctx's values but not its
// cancellation, and ends grace after ctx ends, its cause then wrapping
// context.DeadlineExceeded. release frees its resources.
func graceContext(ctx context.Context, grace time.Duration) (context.Context, func()) {
	wctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel(fmt.Errorf("the cancel grace ran out: %w", context.DeadlineExceeded))
		case <-wctx.Done():
		}
	})
	return wctx, func() {
		stop()
		cancel(nil)
	}
}

// kinds names a batch of events for an error message.
func kinds(evs []events.Event) string {
	names := make([]string, len(evs))
	for i, ev := range evs {
		names[i] = string(ev.Kind())
	}
	return strings.Join(names, "+")
}

// emit delivers one durable event; errors and panics are counted.
func (d *driver) emit(ctx context.Context, env events.Envelope) {
	if d.def.Events == nil {
		return
	}
	defer func() {
		if recover() != nil {
			d.failures++
		}
	}()
	if err := d.def.Events.Emit(ctx, env); err != nil {
		d.failures++
	}
}

// panicText words a recovered panic value as %v does, at most
// events.MaxTextBytes of it, which is all a run stores: a string is
// clipped before it is formatted (fmt copied a parser's 32 MiB panic
// string whole, seconds under the race detector, for all but 8 MiB of it
// to be cut); anything else is formatted by fmt, which also survives a
// nil pointer's Error method panicking.
func panicText(p any) string {
	s, ok := p.(string)
	if !ok {
		s = fmt.Sprint(p)
	}
	return events.Clip(s, events.MaxTextBytes)
}

func (d *driver) callModel(ctx context.Context, call seams.ModelCall) (reply events.ModelReply, err error) {
	defer func() {
		if p := recover(); p != nil {
			reply, err = events.ModelReply{}, fmt.Errorf("model client panicked: %s", panicText(p))
		}
	}()
	return d.def.Model.Call(ctx, call)
}

func (d *driver) execute(ctx context.Context, call seams.ActionCall) (out events.ActionOutcome, err error) {
	defer func() {
		if p := recover(); p != nil {
			out, err = events.ActionOutcome{}, fmt.Errorf("executor panicked: %s", panicText(p))
		}
	}()
	return d.req.Executor.Execute(ctx, call)
}
