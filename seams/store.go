package seams

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
)

// RunStore persists run streams. Implementations: kv.Store (bbolt),
// pgstore.Store (PostgreSQL) and seamstest.MemStore.
// proptest.RunStoreContract checks any implementation.
//
// Append writes evs, in order, in one transaction, to runID's stream, and
// returns their envelopes once they are durable. after is the id of the
// last event the caller has seen in the stream (the zero ULID for a stream
// it has seen empty): the append is optimistic, and it fails with
// ErrTailMoved, writing nothing, when the stream's last event is another —
// so of two writers continuing one tail, exactly one wins. It fails with ErrRunExists when
// evs starts with RunStarted and the stream is not empty (atomically: of two
// concurrent starts exactly one wins), with ErrRunNotStarted when the stream
// is empty and evs does not start with RunStarted, with ErrRunFinished when
// the stream already holds RunFinished, with ErrInvalidRunID for a run id
// ValidRunID refuses, and with an error naming the problem for an event
// that fails Validate or names another run. A failed Append writes
// nothing. The returned slice belongs to the caller; the
// store keeps no reference to it. The keys an Append mints are after every key the
// stream already holds, whatever the clock says.
//
// Load returns runID's whole stream in order; a run never written is an
// empty stream and no error. A run id ValidRunID refuses is an error
// wrapping ErrInvalidRunID (no store keeps such a run, and every store
// says so alike, never with a database's error). A store failure is always an error, never an
// empty stream. A stream that is damaged (values that do not decode or fail
// their checksum, events missing) is an error wrapping *events.DamageError,
// returned together with the events that did decode, so recovery can list
// everything wrong (recovery.ClassifyLoaded). The returned slice belongs to
// the caller.
type RunStore interface {
	Append(ctx context.Context, runID string, after ulid.ULID, evs ...events.Event) ([]events.Envelope, error)
	Load(ctx context.Context, runID string) ([]events.Envelope, error)
	Parameters() map[string]string
}

// RunLocker is implemented by a RunStore that can reserve a run for one
// driver at a time. The engine takes the lock before it reads a run and
// holds it until the run returns, so a second driver on the same run fails
// before it calls the model or executes anything, even a replay declared
// safe. The lock is a courtesy that spares such replays; the guarantee that
// two drivers never both continue a run is Append's tail rule, which holds
// whether or not a store implements RunLocker.
type RunLocker interface {
	// LockRun reserves runID, or fails at once with an error wrapping
	// ErrRunLocked when it is reserved. release ends the reservation; it is
	// safe to call more than once.
	LockRun(runID string) (release func(), err error)
}

// RunLeaser is implemented by a RunLocker whose reservations are leases:
// held for a term and renewed while the run is driven, so that a driver
// that dies or is cut off loses its run to another after the term. A
// driver paused past its term (a stopped process, a long GC pause, a
// network partition) may find its run taken over when it wakes; the engine
// therefore asks HoldsRun before every model call and every side effect,
// and a driver that no longer holds its run stops, executing nothing more.
// Its appends are refused too (the store's own check, and the tail rule
// behind it). A store that wraps another must forward HoldsRun with
// LockRun: the engine finds it by a type assertion on Definition.Store, and
// a wrapper that hides it leaves a driver that lost its lease free to
// execute the action it was about to (its appends are still refused).
type RunLeaser interface {
	RunLocker
	// HoldsRun returns nil when this process still holds runID, renewing
	// the lease first when what is left of its term is too short to rely
	// on; an error wrapping ErrRunLocked when the run was taken over or
	// released; any other error when the lease could not be renewed (the
	// caller must then act as if the run were lost: it may have been).
	HoldsRun(ctx context.Context, runID string) error
}

// Store contract errors. Implementations wrap them; test with errors.Is.
var (
	// ErrRunExists: a RunStarted was appended to a stream that has events.
	ErrRunExists = errors.New("seams: run exists")
	// ErrRunNotStarted: the first event appended to a stream was not RunStarted.
	ErrRunNotStarted = errors.New("seams: run not started: the first event must be run_started")
	// ErrRunFinished: an event was appended after RunFinished.
	ErrRunFinished = errors.New("seams: run finished: nothing may follow run_finished")
	// ErrTailMoved: an append named a tail that is not the stream's last
	// event: another writer appended since the caller last saw the stream.
	ErrTailMoved = errors.New("seams: the stream's tail moved: another writer appended to the run")
	// ErrRunLocked: LockRun found the run reserved by another driver.
	ErrRunLocked = errors.New("seams: run is held by another driver")
	// ErrNoRun: the store holds no run of that id.
	ErrNoRun = errors.New("seams: no such run")
	// ErrInvalidRunID: a run id ValidRunID refuses, which no store keeps.
	// Every store's Append, Load and Scan refuse one with it, before
	// touching the store, and the engine's request validation wraps it.
	ErrInvalidRunID = errors.New("seams: invalid run id")
	// ErrStreamChanged: a run's stream no longer continues from the event
	// a reader saw last (LoadAfter): the run was deleted, or deleted and
	// started again.
	ErrStreamChanged = errors.New("seams: the run's stream no longer continues from the event last seen (the run was deleted or replaced)")
	// ErrRunNotFinished: DeleteRun without force found no RunFinished.
	ErrRunNotFinished = errors.New("seams: run is not finished (it may be resumed); delete it only with force")
)

// RunDeleter is implemented by stores that can delete runs (retention).
// DeleteRun removes runID's stream and index entry in one transaction. It
// refuses, writing nothing, a run a driver holds (ErrRunLocked: the store
// reserves the run while it deletes, so a driver cannot start meanwhile
// either), a run that has not finished unless force (ErrRunNotFinished),
// and a run it does not hold (ErrNoRun). A resumed deleted run is a run
// never written.
type RunDeleter interface {
	DeleteRun(ctx context.Context, runID string, force bool) error
}

// MaxRunIDBytes bounds a run id: an id is a key in every store (PostgreSQL's
// btree refuses index entries much over 2,700 bytes), and errors quote it.
const MaxRunIDBytes = 1024

// ValidRunID applies the one rule for run ids that every store and the
// engine share: an id is non-empty, at most MaxRunIDBytes bytes of valid
// UTF-8, without control characters (Unicode Cc: NUL and the rest of C0,
// DEL, C1). PostgreSQL text holds no NUL and no invalid UTF-8, so no store
// keeps them; a control character would let an id rewrite the terminal
// that prints it or break line-oriented output. An error wraps
// ErrInvalidRunID and says what is wrong, quoting at most the id's first 64
// bytes.
func ValidRunID(id string) error { return validName(ErrInvalidRunID, id, MaxRunIDBytes) }

// validName is ValidRunID's rule with another limit and error.
func validName(invalid error, id string, limit int) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: it is empty", invalid)
	case len(id) > limit:
		return fmt.Errorf("%w: it is %d bytes, longer than the %d-byte limit (it begins %q)", invalid, len(id), limit, clipID(id))
	case !utf8.ValidString(id):
		return fmt.Errorf("%w %q: it is not valid UTF-8", invalid, clipID(id))
	}
	for _, r := range id {
		switch {
		case r == 0:
			return fmt.Errorf("%w %q: it holds a NUL byte (U+0000), a control character", invalid, clipID(id))
		case unicode.IsControl(r):
			return fmt.Errorf("%w %q: it holds the control character %U", invalid, clipID(id), r)
		}
	}
	return nil
}

// clipID is at most the first 64 bytes of id, for an error.
func clipID(id string) string {
	if len(id) > 64 {
		return id[:64] + "…"
	}
	return id
}

// CheckAppend applies the append rules of RunStore to a batch, given the
// stream's last key (tail; zero for an empty stream), whether its last
// event is RunFinished (finished), and the tail the caller named (after).
// Stores call it before writing anything, so a refused batch leaves the
// stream as it was.
func CheckAppend(runID string, tail ulid.ULID, finished bool, after ulid.ULID, evs []events.Event) error {
	if err := ValidRunID(runID); err != nil {
		return fmt.Errorf("append: %w", err)
	}
	if len(evs) == 0 {
		return errors.New("append: no events")
	}
	for i, ev := range evs {
		if ev == nil {
			return fmt.Errorf("append: event %d is nil", i)
		}
		if got := events.RunIDOf(ev); got != runID {
			return fmt.Errorf("append: event %d (%s) belongs to run %q, not %q", i, ev.Kind(), got, runID)
		}
		if err := ev.Validate(); err != nil {
			return fmt.Errorf("append: event %d (%s): %w", i, ev.Kind(), err)
		}
	}
	started := tail != (ulid.ULID{})
	if after != tail {
		if started && evs[0].Kind() == events.KindRunStarted {
			return fmt.Errorf("append to %q: %w", runID, ErrRunExists)
		}
		return fmt.Errorf("append to %q after %s: %w (its last event is %s)", runID, idText(after), ErrTailMoved, idText(tail))
	}
	for i, ev := range evs {
		switch {
		case finished:
			return fmt.Errorf("append to %q: %w", runID, ErrRunFinished)
		case ev.Kind() == events.KindRunStarted && (started || i > 0):
			return fmt.Errorf("append to %q: %w", runID, ErrRunExists)
		case !started && i == 0 && ev.Kind() != events.KindRunStarted:
			return fmt.Errorf("append %s to %q: %w", ev.Kind(), runID, ErrRunNotStarted)
		}
		started = true
		finished = ev.Kind() == events.KindRunFinished
	}
	return nil
}

// idText names a tail in an error: an id, or "nothing" for an empty stream.
func idText(id ulid.ULID) string {
	if id == (ulid.ULID{}) {
		return "nothing (an empty stream)"
	}
	return id.String()
}

// RunLocks is an in-process RunLocker for stores to embed: a set of
// reserved run ids. The zero value is ready; safe for concurrent use.
type RunLocks struct {
	mu   sync.Mutex
	held map[string]bool
}

// LockRun implements RunLocker.
func (l *RunLocks) LockRun(runID string) (func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held[runID] {
		return nil, fmt.Errorf("run %q: %w in this process", runID, ErrRunLocked)
	}
	if l.held == nil {
		l.held = map[string]bool{}
	}
	l.held[runID] = true
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			delete(l.held, runID)
			l.mu.Unlock()
		})
	}, nil
}

// Held reports whether runID is reserved.
func (l *RunLocks) Held(runID string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held[runID]
}

// RunReader is what readers need of a store — the inspector, a viewer, an
// administrative command — so they depend on it and not on one store: list
// the runs from the store's index without scanning streams, and load one
// run's stream (with the damage reporting of RunStore.Load). kv.Store and
// pgstore.Store implement it, read-only opened stores included.
type RunReader interface {
	// Runs lists every run the store's index holds, ordered by run id. An
	// entry the store finds damaged, and a stream whose entry is lost, are
	// listed with StatusCorrupt.
	Runs(ctx context.Context) ([]RunInfo, error)
	Load(ctx context.Context, runID string) ([]events.Envelope, error)
}

// RunScanner is implemented by stores that can hand a run's stream over one
// event at a time, so a reader of a long run (engine.Resume) need not hold
// it whole. Scan calls fn with each event in order, with Load's checks:
// the error is what Load's would be (an *events.DamageError for damage,
// found after the events that decoded were handed over), or fn's own,
// which stops the scan. kv.Store and pgstore.Store implement it; Resume
// uses Load on stores that do not. kv reads inside one read transaction, so
// fn should not be slow: a writer that must grow the file waits for the
// scan to end.
type RunScanner interface {
	Scan(ctx context.Context, runID string, fn func(events.Envelope) error) error
}

// RunTailer is implemented by stores that can read a run's stream from a
// place in it, so a reader following a run (report.Follower) reads only
// what is new: kv.Store walks back from the run's last key, pgstore.Store
// reads the rows numbered after it. LoadAfter (below) falls back to Load
// for stores without it.
type RunTailer interface {
	// LoadAfter returns the events of runID's stream after its first seen
	// (all of them when seen is 0): what Load returns after them. last is
	// the key of the seen-th event, which the store checks: a stream that
	// holds fewer events or another seen-th one no longer continues what
	// the caller saw, and is refused with ErrStreamChanged. Damage is
	// reported as Load reports it (an *events.DamageError, with the events
	// after the first seen that decoded); a store checks what it reads —
	// the events after the first seen, their link to the seen-th, the
	// run's index entry — and may leave damage before them to Load. A run
	// id ValidRunID refuses is ErrInvalidRunID; a negative seen, an error
	// naming it. The returned slice belongs to the caller.
	LoadAfter(ctx context.Context, runID string, seen int, last ulid.ULID) ([]events.Envelope, error)
}

// LoadAfter is RunTailer.LoadAfter of any store: s's own when it is a
// RunTailer, otherwise Load's stream after its first seen events
// (StreamAfter).
func LoadAfter(ctx context.Context, s interface {
	Load(ctx context.Context, runID string) ([]events.Envelope, error)
}, runID string, seen int, last ulid.ULID) ([]events.Envelope, error) {
	if t, ok := s.(RunTailer); ok {
		return t.LoadAfter(ctx, runID, seen, last)
	}
	stream, err := s.Load(ctx, runID)
	return StreamAfter(runID, stream, err, seen, last)
}

// StreamAfter is what LoadAfter returns, given what Load returned for
// runID (stream and err): the events after the first seen, with err, when
// the seen-th is last; err alone when it is not and Load reported a
// problem (damage may be why); ErrStreamChanged otherwise. A negative seen
// is an error naming it.
func StreamAfter(runID string, stream []events.Envelope, err error, seen int, last ulid.ULID) ([]events.Envelope, error) {
	switch {
	case seen < 0:
		return nil, fmt.Errorf("load run %q after %d events: want a count of events seen, 0 or more", clipID(runID), seen)
	case seen == 0:
		return stream, err
	case seen <= len(stream) && stream[seen-1].ID == last:
		return stream[seen:], err
	case err != nil:
		return nil, err
	case seen > len(stream):
		return nil, fmt.Errorf("run %q holds %d events, fewer than the %d seen: %w", clipID(runID), len(stream), seen, ErrStreamChanged)
	}
	return nil, fmt.Errorf("run %q: its event %d is %s, not %s as seen: %w", clipID(runID), seen, stream[seen-1].ID, last, ErrStreamChanged)
}

// RunFinder is implemented by stores that can say whether a run has
// anything stored without reading its stream. engine.Resume asks before it
// takes the run's lock; of a store without it, it reads the first event
// (RunScanner) or the whole stream.
type RunFinder interface {
	// HasRun reports whether runID has events or an index entry.
	HasRun(ctx context.Context, runID string) (bool, error)
}

// RunStatus is where a run stands, in the one vocabulary of PolyLoop's
// stores, readers and commands: a store's listing (RunInfo.Status),
// report's listings, `polyloop-inspect runs --status` and the viewer's
// ?status=.
type RunStatus string

const (
	// StatusFinished: the stream ends with RunFinished.
	StatusFinished RunStatus = "finished"
	// StatusRunning: the run has no RunFinished and a live driver holds
	// it (RunInfo.Owner, until RunInfo.LeaseExpires unless renewed). A
	// store's index entry says running of every run without RunFinished;
	// a listing tells who holds it (RunInfo.Liveness).
	StatusRunning RunStatus = "running"
	// StatusAwaiting: the run has no RunFinished, nobody holds it, and it
	// waits for a worker: an agent's run that was submitted, given back by
	// a worker that shut down, or handed back by an operator.
	StatusAwaiting RunStatus = "awaiting"
	// StatusInterrupted: the run has no RunFinished and nobody holds it:
	// its driver stopped, or died and its lease ran out. A worker claims
	// an agent's run; any other run waits for engine.Resume.
	StatusInterrupted RunStatus = "interrupted"
	// StatusInDoubt: a run nobody holds (awaiting or interrupted) whose
	// tail leaves a side effect's outcome unknown. Only a reader that
	// classifies the log tells it (recovery.State.Status); an index never
	// says it, and a run a driver holds is running whatever its tail.
	StatusInDoubt RunStatus = "in_doubt"
	// StatusAwaitingApproval: an unfinished run whose tail is an action
	// awaiting a person's approval (engine.Decide); nothing continues it
	// until a decision is recorded (a worker looks at it again now and
	// then, and parks it again). StatusAwaitingResolution: one whose
	// tail is an action in doubt awaiting an operator's finding
	// (engine.Resolve). Like in_doubt, only a reader that classifies the
	// log tells them; an index says running.
	StatusAwaitingApproval   RunStatus = "awaiting_approval"
	StatusAwaitingResolution RunStatus = "awaiting_resolution"
	// StatusCorrupt: the run is damaged: an index entry that fails its
	// checksum (only RunID is known), a stream whose entry is lost, or a
	// log a reader found damaged or breaking a structural rule. Loading
	// the run reports why, with an error matching events.ErrCorruption.
	StatusCorrupt RunStatus = "corrupt"
)

// RunStatuses lists every RunStatus, in the order listings explain them.
var RunStatuses = []RunStatus{StatusFinished, StatusRunning, StatusAwaiting, StatusInterrupted, StatusInDoubt,
	StatusAwaitingApproval, StatusAwaitingResolution, StatusCorrupt}

// Resumable reports whether a run in status s has no end recorded and a
// sound log, so engine.Resume continues it (running, awaiting or
// interrupted — a running one once its driver lets go) or settles the
// side effect in doubt (in_doubt).
func (s RunStatus) Resumable() bool {
	return s == StatusRunning || s == StatusAwaiting || s == StatusInterrupted || s == StatusInDoubt
}

// Held reports whether s says a live driver holds the run.
func (s RunStatus) Held() bool { return s == StatusRunning }

// RunInfo is a run's index entry, which a store maintains in the
// transaction of every append. Events and LastID anchor the stream: a
// store's Load refuses a stream with another length or another last key,
// so an event missing in the middle or at the tail is noticed. How a store
// keeps it is the store's (kv's msgpack entry, pgstore's row).
type RunInfo struct {
	RunID      string            `json:"run_id"`
	Status     RunStatus         `json:"status"`
	Steps      int               `json:"steps"`
	Events     int               `json:"events"`
	StopReason events.StopReason `json:"stop_reason"`
	FirstEvent time.Time         `json:"first_event"`
	LastEvent  time.Time         `json:"last_event"`
	// LastID is the key of the stream's last event (zero in kv entries
	// written before the store kept it).
	LastID ulid.ULID `json:"last_id"`

	// What follows is coordination, not the run's data: a listing fills it
	// from the store's queue and leases (outside the entry's checksum).

	// Agent is the agent the run was started for (RunStarted.Agent), ""
	// for a run no worker pool claims.
	Agent string `json:"agent,omitempty"`
	// Owner is the driver that holds or last held the run (a lease's
	// owner, see pgstore.Options.Owner and kv.Store.Owner), "" when nobody
	// does. LeaseExpires is when its hold runs out unless renewed; a
	// holder whose lease ran out no longer holds the run.
	Owner        string    `json:"owner,omitempty"`
	LeaseExpires time.Time `json:"lease_expires,omitzero"`
	// Failures counts the times a worker gave the run back because driving
	// it failed since it was submitted or last handed back by an
	// operator; LastError is the last such failure, and RetryAt when a
	// worker may claim the run again.
	Failures  int       `json:"failures,omitempty"`
	LastError string    `json:"last_error,omitempty"`
	RetryAt   time.Time `json:"retry_at,omitzero"`
	// CancelRequested is an operator's request to cancel the run, not yet
	// carried out (RunCanceller).
	CancelRequested *CancelRequest `json:"cancel_requested,omitempty"`
}

// Apply folds one appended event into the entry: what every store does
// with each event it writes, so all stores count alike.
func (r *RunInfo) Apply(env events.Envelope) {
	if r.Events == 0 {
		r.FirstEvent = env.Time()
		r.Status = StatusRunning
	}
	r.Events++
	r.LastEvent = env.Time()
	r.LastID = env.ID
	// A writer may append a record as a value or a pointer to one.
	if _, ok := events.As[events.StepCompleted](env.Event); ok {
		r.Steps++
	}
	if f, ok := events.As[events.RunFinished](env.Event); ok {
		r.Status = StatusFinished
		r.StopReason = f.Result.StopReason
	}
}
