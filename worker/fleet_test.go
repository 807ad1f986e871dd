package worker_test

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/internal/soak"
	"github.com/polyloop/polyloop/parsers"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/scripted"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/stores"
	"github.com/polyloop/polyloop/worker"
)

// The fleet test's worker processes are this test binary, started with
// these variables set.
const (
	childStoreEnv  = "POLYLOOP_FLEET_CHILD_STORE"  // the store: a file or a PostgreSQL URL
	childLedgerEnv = "POLYLOOP_FLEET_CHILD_LEDGER" // where each execution is recorded
	// set: the worker stops by itself once its store lists no unfinished run
	childUntilDoneEnv = "POLYLOOP_FLEET_CHILD_UNTIL_DONE"
	// how many runs a worker drives at once, and the longest a tool takes
	// (in milliseconds; it takes from a fifth of that)
	childConcurrencyEnv = "POLYLOOP_FLEET_CHILD_CONCURRENCY"
	childToolMillisEnv  = "POLYLOOP_FLEET_CHILD_TOOL_MS"
)

func TestMain(m *testing.M) {
	if os.Getenv(childStoreEnv) != "" {
		os.Exit(fleetChild(os.Getenv(childStoreEnv), os.Getenv(childLedgerEnv)))
	}
	os.Exit(pgtest.Main(m))
}

// fleetLease is the lease term of the fleet's workers on PostgreSQL, and
// fleetClaim their claim interval: a dead worker's runs are taken over
// within the two.
const (
	fleetLease = 2 * time.Second
	fleetClaim = 100 * time.Millisecond
)

// ledger records each execution of a tool — its result id and policy —
// in a file shared by every worker process, one line per execution
// written with one append before the tool's effect is reported: what a
// real side effect leaves behind whether or not its outcome becomes
// durable.
type ledger struct {
	mu     sync.Mutex
	path   string
	toolMs int // the longest a tool takes; 25 when 0
}

func (l *ledger) Execute(ctx context.Context, call seams.ActionCall) (events.ActionOutcome, error) {
	policy := events.ReplaySafe
	if call.Action.ToolCall != nil && call.Action.ToolCall.Name == "charge" {
		policy = events.ReplayNever
	}
	l.mu.Lock()
	f, err := os.OpenFile(l.path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err == nil {
		_, err = fmt.Fprintf(f, "%s %s %s\n", call.RunID, call.ResultID, policy)
		f.Close()
	}
	l.mu.Unlock()
	if err != nil {
		return events.ActionOutcome{}, err
	}
	longest := cmp.Or(l.toolMs, 25)
	time.Sleep(time.Duration(longest/5+rand.IntN(longest-longest/5+1)) * time.Millisecond) // the effect takes a while: a kill may land in it
	return events.ActionOutcome{Status: events.StatusExecuted, Observation: "done: " + call.Action.Text}, nil
}

func (*ledger) Parameters() map[string]string { return map[string]string{"kind": "ledger"} }

// fleetAgent alternates a lookup (safe to replay) and a charge (never) as
// many times as its input says, then answers.
func fleetAgent(l *ledger) worker.Agent {
	return func(ctx context.Context, runID string, input []byte) (engine.Definition, engine.Request, error) {
		var n int
		if _, err := fmt.Sscan(string(input), &n); err != nil || n < 1 {
			return engine.Definition{}, engine.Request{}, fmt.Errorf("input %q is not a positive count", input)
		}
		tools, err := seams.NewRegistry(
			seams.Tool{Spec: seams.ToolSpec{Name: "lookup", ReplayPolicy: events.ReplaySafe}, Handler: noHandler},
			seams.Tool{Spec: seams.ToolSpec{Name: "charge", ReplayPolicy: events.ReplayNever}, Handler: noHandler},
		)
		if err != nil {
			return engine.Definition{}, engine.Request{}, err
		}
		var replies []string
		for i := range n {
			replies = append(replies, fmt.Sprintf(`TOOL lookup {"i":%d}`, i), fmt.Sprintf(`TOOL charge {"i":%d}`, i))
		}
		replies = append(replies, "FINAL: charged")
		return engine.Definition{Model: &scripted.Model{Turns: scripted.Replies(replies...)}, Parser: parsers.ToolCalls{}},
			engine.Request{Tools: tools, Executor: l, ModelReplayPolicy: events.ReplaySafe,
				Budget:  engine.Budget{MaxSteps: 2*n + 2, MaxActions: 2*n + 2, MaxConsecutiveParseFailures: 2, MaxPromptChars: 100_000},
				Context: engine.Context{GoalLevel: []seams.Message{seams.Text(seams.RoleUser, "charge "+runID)}}}, nil
	}
}

func noHandler(context.Context, map[string]any) (string, error) {
	return "", errors.New("the ledger executes this tool")
}

// fleetChild is a worker process: it works the pool on store until
// SIGTERM (then stops gracefully, exit 0) or SIGKILL. It prints its owner
// first.
func fleetChild(target, ledgerPath string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	store, err := stores.Open(context.Background(), target, stores.Options{LockTimeout: 30 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 3
	}
	defer store.Close()
	if o, ok := store.(interface{ Owner() string }); ok {
		fmt.Printf("owner %s\n", o.Owner())
	}
	concurrency, _ := strconv.Atoi(os.Getenv(childConcurrencyEnv))
	toolMs, _ := strconv.Atoi(os.Getenv(childToolMillisEnv))
	pool, err := worker.New(store, map[string]worker.Agent{"fleet": fleetAgent(&ledger{path: ledgerPath, toolMs: toolMs})},
		worker.Options{Concurrency: cmp.Or(concurrency, 64), ClaimInterval: fleetClaim, RetryAfter: 50 * time.Millisecond, MaxRetryAfter: time.Second,
			Done: func(runID string, res events.RunResult, err error) {
				if err != nil && !errors.Is(err, engine.ErrInterrupted) && !errors.Is(err, engine.ErrRunBusy) {
					fmt.Fprintf(os.Stderr, "child: %s: %v\n", runID, err)
				}
			}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 3
	}
	if os.Getenv(childUntilDoneEnv) != "" {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		go func() {
			for unfinished(noTB{}, store) > 0 {
				time.Sleep(100 * time.Millisecond)
			}
			cancel()
		}()
	}
	if err := pool.Work(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 4
	}
	fmt.Println("stopped")
	return 0
}

// child is a running worker process.
type child struct {
	cmd    *exec.Cmd
	owner  string
	out    *strings.Builder
	exited chan error
}

func startFleetChild(t *testing.T, store, ledgerPath string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childStoreEnv+"="+store, childLedgerEnv+"="+ledgerPath,
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	cmd.Env = append(cmd.Env, env...)
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, out: &strings.Builder{}, exited: make(chan error, 1)}
	cmd.Stderr = c.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	owner := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			if o, ok := strings.CutPrefix(sc.Text(), "owner "); ok {
				owner <- o
			}
		}
		c.exited <- cmd.Wait()
	}()
	select {
	case c.owner = <-owner:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("a worker did not start: %s", c.out.String())
	}
	return c
}

// submitFleet submits n runs of 1 to 3 lookup-and-charge rounds.
func submitFleet(t *testing.T, target string, n int) {
	t.Helper()
	store, err := stores.Open(context.Background(), target, stores.Options{LockTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	pool, err := worker.New(store, map[string]worker.Agent{"fleet": fleetAgent(&ledger{})}, worker.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := pool.Submit(context.Background(), "fleet", fmt.Sprintf("fleet-%04d", i), []byte(fmt.Sprint(1+i%3))); err != nil {
			t.Fatal(err)
		}
	}
}

// fleetOutcome checks what the fleet left: every run finished, agent_finished
// or resume_state_unknown (a charge in doubt, never made again); no charge
// executed twice; and it returns how many runs ended in doubt.
func fleetOutcome(t *testing.T, target, ledgerPath string) (unknown int) {
	t.Helper()
	store, err := stores.Open(context.Background(), target, stores.Options{ReadOnly: true, LockTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	infos, err := store.Runs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range infos {
		if info.Status != seams.StatusFinished {
			t.Errorf("%s is %s, not finished", info.RunID, info.Status)
			continue
		}
		switch info.StopReason {
		case events.StopAgentFinished:
		case events.StopResumeStateUnknown:
			unknown++
			log, err := store.Load(context.Background(), info.RunID)
			if _, err := recovery.ClassifyLoaded(info.RunID, log, err); err != nil {
				t.Errorf("%s: %v", info.RunID, err)
			}
		default:
			t.Errorf("%s stopped %s: a worker's stop or kill must not end a run another way", info.RunID, info.StopReason)
		}
	}
	raw, err := os.ReadFile(ledgerPath)
	if err != nil {
		t.Fatal(err)
	}
	executed := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[2] == string(events.ReplayNever) {
			executed[f[1]]++
		}
	}
	for id, n := range executed {
		if n > 1 {
			t.Errorf("the charge %s (never) was executed %d times", id, n)
		}
	}
	t.Logf("%d runs, %d charges executed, %d runs ended resume_state_unknown", len(infos), len(executed), unknown)
	return unknown
}

// noTB stands in for a test in a worker process: a failure is fatal.
type noTB struct{}

func (noTB) Fatal(args ...any) {
	fmt.Fprintln(os.Stderr, append([]any{"child:"}, args...)...)
	os.Exit(5)
}

// unfinished counts the runs s lists unfinished.
func unfinished(t interface{ Fatal(...any) }, s seams.RunReader) int {
	infos, err := s.Runs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, info := range infos {
		if info.Status != seams.StatusFinished {
			n++
		}
	}
	return n
}

// heldBy lists the unfinished runs whose holder is owner.
func heldBy(t *testing.T, s seams.RunReader, owner string) int {
	infos, err := s.Runs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, info := range infos {
		if info.Status != seams.StatusFinished && info.Owner == owner {
			n++
		}
	}
	return n
}

// TestAFleetOfWorkerProcessesSurvivesKills: three worker processes on one
// PostgreSQL database drive 300 submitted runs of safe and never tools;
// one worker at a time is killed with SIGKILL at a random moment and a
// new one started (twice, or four times under make soak), the first kill
// mid-work; one is stopped with SIGTERM. Every run
// finishes (agent_finished, or resume_state_unknown for a charge a kill
// left in doubt), no charge is executed twice, a dead worker's runs are
// all taken over once its lease runs out (the time it took is logged),
// and the gracefully stopped worker exits 0, its runs given back and none
// cancelled.
func TestAFleetOfWorkerProcessesSurvivesKills(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	target := pgtest.StoreURL(t) + "&" + pgstore.LeaseParam + "=" + fleetLease.String()
	ledgerPath := filepath.Join(t.TempDir(), "ledger")
	kills := soak.Count(2, 4)
	t.Logf("%d kills", kills)
	submitFleet(t, target, 300)
	reader, err := stores.Open(context.Background(), target, stores.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()

	// Eight runs at a time each, tools of up to 150 ms: the runs outlast
	// the kills, which land in the middle of work.
	env := []string{childConcurrencyEnv + "=8", childToolMillisEnv + "=150"}
	workers := []*child{startFleetChild(t, target, ledgerPath, env...), startFleetChild(t, target, ledgerPath, env...),
		startFleetChild(t, target, ledgerPath, env...)}
	defer func() {
		for _, w := range workers {
			w.cmd.Process.Kill()
		}
	}()
	// Each dead worker's runs must all be taken over (or finished) once
	// its lease runs out; how long that took is measured while the fleet
	// goes on.
	var (
		takeoverMu sync.Mutex
		takeovers  []time.Duration
		watching   sync.WaitGroup
	)
	for kill := range kills {
		time.Sleep(time.Duration(300+rand.IntN(900)) * time.Millisecond)
		i := rand.IntN(len(workers))
		victim := workers[i]
		held := heldBy(t, reader, victim.owner)
		if kill == 0 && held == 0 {
			t.Error("the first kill landed on a worker holding no run: nothing to take over")
		}
		victim.cmd.Process.Signal(syscall.SIGKILL)
		killedAt := time.Now()
		<-victim.exited
		workers[i] = startFleetChild(t, target, ledgerPath, env...)
		watching.Go(func() {
			deadline := killedAt.Add(fleetLease + 60*time.Second)
			for heldBy(t, reader, victim.owner) > 0 {
				if time.Now().After(deadline) {
					t.Errorf("kill %d: %d runs of the dead worker were not taken over", kill, heldBy(t, reader, victim.owner))
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
			took := time.Since(killedAt)
			takeoverMu.Lock()
			takeovers = append(takeovers, took)
			takeoverMu.Unlock()
			t.Logf("kill %d: worker %s held %d unfinished runs; all taken over or finished %v after the kill (lease %v, claim interval %v)",
				kill, victim.owner, held, took.Round(10*time.Millisecond), fleetLease, fleetClaim)
		})
	}
	watching.Wait()
	// A graceful stop: SIGTERM; the worker exits 0 and gives its runs back.
	i := rand.IntN(len(workers))
	graceful := workers[i]
	graceful.cmd.Process.Signal(syscall.SIGTERM)
	if err := <-graceful.exited; err != nil {
		t.Fatalf("the worker stopped with SIGTERM exited with %v: %s", err, graceful.out.String())
	}
	if n := heldBy(t, reader, graceful.owner); n > 0 {
		t.Fatalf("the gracefully stopped worker still holds %d runs", n)
	}
	workers[i] = startFleetChild(t, target, ledgerPath, env...)

	deadline := time.Now().Add(3 * time.Minute)
	for left := unfinished(t, reader); left > 0; left = unfinished(t, reader) {
		if time.Now().After(deadline) {
			t.Fatalf("%d runs still unfinished", left)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, w := range workers {
		w.cmd.Process.Signal(syscall.SIGTERM)
		if err := <-w.exited; err != nil {
			t.Errorf("a worker stopped with SIGTERM exited with %v: %s", err, w.out.String())
		}
	}
	workers = nil
	fleetOutcome(t, target, ledgerPath)
	t.Logf("takeovers after a kill: %v", takeovers)
}

// TestAPoolOnABboltFilePicksUpWhatAKilledProcessLeft: one worker process
// at a time holds the file (200 runs); it is killed at random moments
// (twice, or three times under make soak; the first mid-work) and started
// again, and each new one picks up every unfinished run; at the end all
// are finished, no charge executed twice.
func TestAPoolOnABboltFilePicksUpWhatAKilledProcessLeft(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	dir := t.TempDir()
	target, ledgerPath := filepath.Join(dir, "runs.db"), filepath.Join(dir, "ledger")
	kills := soak.Count(2, 3)
	t.Logf("%d kills", kills)
	submitFleet(t, target, 200)
	// Tools of up to 100 ms: the runs outlast the first kills.
	env := []string{childToolMillisEnv + "=100"}
	for kill := range kills {
		w := startFleetChild(t, target, ledgerPath, env...)
		time.Sleep(time.Duration(200+rand.IntN(600)) * time.Millisecond)
		w.cmd.Process.Signal(syscall.SIGKILL)
		<-w.exited
		s, err := stores.Open(context.Background(), target, stores.Options{ReadOnly: true, LockTimeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		infos, err := s.Runs(context.Background())
		s.Close()
		if err != nil {
			t.Fatal(err)
		}
		left := 0
		for _, info := range infos {
			if info.Status != seams.StatusFinished {
				left++
				if info.Status == seams.StatusRunning {
					t.Errorf("after the kill %s is listed running, held by %s", info.RunID, info.Owner)
				}
			}
		}
		t.Logf("kill %d: %d runs unfinished", kill, left)
		if kill == 0 && left == 0 {
			t.Error("the first kill landed after every run had finished: nothing to pick up")
		}
	}
	// The last worker stops by itself once no run is left unfinished (the
	// file is its while it works: nobody else can look).
	w := startFleetChild(t, target, ledgerPath, append(env, childUntilDoneEnv+"=1")...)
	select {
	case err := <-w.exited:
		if err != nil {
			t.Fatalf("the last worker exited with %v: %s", err, w.out.String())
		}
	case <-time.After(3 * time.Minute):
		w.cmd.Process.Kill()
		t.Fatalf("the last worker did not finish the runs: %s", w.out.String())
	}
	fleetOutcome(t, target, ledgerPath)
}
