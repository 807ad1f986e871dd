package seams

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"
)

// RunQueue is implemented by stores that hand runs to workers (package
// worker). A run started with an agent name (events.RunStarted.Agent) is
// queued in the store's index until it finishes; a worker claims the
// queued runs of the agents it knows that nobody holds, drives them, and
// gives back the ones it stops driving. A finished run has left the
// queue: listings (RunReader.Runs, RunDescriber) show no coordination for
// it — no agent, holder, failures, last error, retry time or cancel
// request. kv.Store and pgstore.Store implement it;
// proptest.RunQueueContract checks an implementation.
type RunQueue interface {
	RunLocker
	// ClaimRuns takes for this store up to max claimable runs of the named
	// agents, in an order of the store's choosing: runs queued and not
	// finished that nobody holds (never claimed, given back, or whose
	// holder's lease ran out; on a store whose holds last as long as the
	// process, held by no driver of this one) and whose retry time has
	// come. A claimed run is held for
	// this store as LockRun holds it on the store's own record (pgstore
	// writes its lease, kv its owner), so no other worker claims it; the
	// worker then drives it — engine.Resume takes it with LockRun, which
	// succeeds for the store that claimed it — or gives it back with
	// ReleaseRun. Until a driver takes it the claim holds it as a driver
	// would: RequestCancel names this store as its holder, RequeueRun
	// refuses it, listings show it running. The first LockRun of the run
	// through this store ends the claim: the run is held while that
	// driver holds it and by nobody once it lets go (awaiting, claimable
	// again, by the claimer too when another driver took the run first).
	// Where several stores share one backing store (pgstore), a run one
	// claimed is no other's to claim or lock. A claim reads an index of
	// the claimable runs, never every run. An empty agents or a max under
	// 1 claims nothing; an agent name ValidAgent refuses is an error.
	ClaimRuns(ctx context.Context, agents []string, max int) ([]Claim, error)
	// ReleaseRun gives back a run this store claimed and no longer drives
	// (its driver let go, or never took it). With an empty failure the run
	// is claimable after retry — at once for 0 (a worker that shuts down),
	// later for a run that waits for something else, a person's decision
	// — its failure count and last error kept; otherwise failure is
	// recorded as the run's last error, its failure count goes up, and it
	// is claimable again after retry. A run a driver of this store
	// holds, one another store holds now, a finished run, a run started
	// without an agent and a run the store does not hold are left as they
	// are (nil error, nothing written). A negative retry is an error.
	ReleaseRun(ctx context.Context, runID, failure string, retry time.Duration) error
	// RequeueRun hands an interrupted run to the workers now (an
	// operator's resume): its retry time, failure count and last error are
	// cleared, and so is a holder whose lease ran out. It fails with
	// ErrNoRun for a run the store does not hold, ErrRunFinished for a
	// finished one, ErrNotQueued for a run started without an agent, and
	// ErrRunLocked (naming the holder) for a run a live driver holds or a
	// live claim holds for its driver; each writes nothing. A cancel
	// request stays.
	RequeueRun(ctx context.Context, runID string) error
}

// RunDescriber is implemented by stores that can describe one run as
// RunReader.Runs lists it — index entry, holder, queue — without listing
// every run (a reader following a run asks it whether anyone drives it).
type RunDescriber interface {
	// Describe returns runID's entry with its liveness (RunInfo.Liveness);
	// ErrNoRun when the store does not hold the run.
	Describe(ctx context.Context, runID string) (RunInfo, error)
}

// Claim is a run ClaimRuns took: its id and the agent it was started with.
type Claim struct {
	RunID string
	Agent string
}

// RunCanceller is implemented by stores that keep operators' requests to
// cancel a run, so a run another process drives can be cancelled from
// outside (engine.Cancel). The engine of the driving process asks
// CancelRequested as it observes each input — before every model call and
// every side effect — and a run whose cancellation was requested ends
// cancelled, as if its context had been cancelled. kv.Store and
// pgstore.Store implement it.
type RunCanceller interface {
	// RequestCancel records, durably, that runID is to be cancelled and by
	// whom (an opaque name), unless a request is recorded already (the
	// first one stays). It returns the run's holder — a live driver's, or
	// a claim's whose worker has not taken the run yet (it takes it at
	// once and sees the request) — or "" when nobody holds it: then nobody
	// will see the request until the run is taken, and the caller may
	// finish the run itself. It fails with ErrNoRun for a run the store
	// does not hold and ErrRunFinished for a finished one, writing
	// nothing.
	RequestCancel(ctx context.Context, runID, by string) (holder string, err error)
	// CancelRequested returns the request recorded for runID, nil when
	// there is none. For a run this store holds it answers without a
	// round trip to a server: from what taking the run, its last append
	// or its last lease renewal read back, so a request recorded before
	// the append of an action's intent committed is seen before the
	// action executes, and one recorded through this store at once. A
	// finished run, and a run never written, have none.
	CancelRequested(ctx context.Context, runID string) (*CancelRequest, error)
}

// CancelRequest is an operator's durable request to cancel a run.
type CancelRequest struct {
	By string    `json:"by"`
	At time.Time `json:"at"`
}

// ErrNotQueued: a run started without an agent is no worker's to claim;
// resume it with engine.Resume.
var ErrNotQueued = errors.New("seams: the run was not started for an agent, so no worker pool claims it (resume it with engine.Resume)")

// NewOwner is a store's name for the holder of the runs it holds and
// claims (RunInfo.Owner): name — host and process id when empty — and a
// random suffix, so that no two stores, nor two opens of one file, share
// one whatever names they are given; readable in a listing.
func NewOwner(name string) string {
	if name == "" {
		host, err := os.Hostname()
		if err != nil {
			host = "unknown-host"
		}
		name = fmt.Sprintf("%s/%d", host, os.Getpid())
	}
	var r [4]byte
	rand.Read(r[:])
	return name + "/" + hex.EncodeToString(r[:])
}

// MaxAgentBytes bounds an agent's name (ValidAgent).
const MaxAgentBytes = 256

// ValidAgent applies the rule for agent names: ValidRunID's, with a limit
// of MaxAgentBytes bytes. An error wraps ErrInvalidAgent and says what is
// wrong.
func ValidAgent(name string) error { return validName(ErrInvalidAgent, name, MaxAgentBytes) }

// ErrInvalidAgent: an agent name ValidAgent refuses.
var ErrInvalidAgent = errors.New("seams: invalid agent name")

// Liveness sets Status from what a store knows of who holds the run, for
// an entry whose index says running (a run without RunFinished); other
// statuses are left as they are. A holder whose lease has not run out at
// now drives the run (StatusRunning); a run whose holder's lease ran out
// is StatusInterrupted; a run nobody holds is StatusAwaiting when it is
// queued for workers (an agent's run: submitted, given back by a worker
// that shut down, or handed back by an operator) and StatusInterrupted
// otherwise (nothing continues it until engine.Resume does).
func (r *RunInfo) Liveness(now time.Time) {
	if r.Status != StatusRunning {
		return
	}
	switch {
	case r.Owner != "" && (r.LeaseExpires.IsZero() || now.Before(r.LeaseExpires)):
		r.Status = StatusRunning
	case r.Owner == "" && r.Agent != "":
		r.Status = StatusAwaiting
	default:
		r.Status = StatusInterrupted
	}
}
