package proptest_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/internal/soak"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
	"github.com/polyloop/polyloop/stores"
)

// The real-crash test: the test binary starts itself as a child that runs
// an agent on a real store file; the parent kills it with SIGKILL at a
// random moment, resumes the run in-process, and checks that it finished as
// the uninterrupted run does, with nothing lost and no never action
// executed twice. Executions are counted across processes in a log file
// the executor appends to (and syncs) before each action returns.

const (
	childStoreEnv = "POLYLOOP_KILL_CHILD_STORE"
	childRunEnv   = "POLYLOOP_KILL_CHILD_RUN"
	childExecEnv  = "POLYLOOP_KILL_CHILD_EXECLOG"
	childModeEnv  = "POLYLOOP_KILL_CHILD_MODE" // run (default) or resume
	killSteps     = 30
)

// killScript alternates a safe and a never tool, with a parse failure now
// and then, and ends with a final answer.
func killScript() []seamstest.Turn {
	var replies []string
	for i := range killSteps {
		switch i % 5 {
		case 4:
			replies = append(replies, "hmm")
		case 1, 3:
			replies = append(replies, fmt.Sprintf(`TOOL pay {"amount":%d}`, i))
		default:
			replies = append(replies, fmt.Sprintf(`TOOL count {"dir":"d%d"}`, i))
		}
	}
	return seamstest.Replies(append(replies, "FINAL: all done")...)
}

// loggingExecutor records each execution's result id and policy in a file,
// synced, then answers deterministically.
type loggingExecutor struct {
	mu   sync.Mutex
	path string
}

func (e *loggingExecutor) Execute(_ context.Context, c seams.ActionCall) (events.ActionOutcome, error) {
	spec, _ := registry.SpecFor(c.Action.ToolCall.Name)
	e.mu.Lock()
	f, err := os.OpenFile(e.path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err == nil {
		fmt.Fprintf(f, "%s %s\n", c.ResultID, spec.ReplayPolicy)
		err = f.Sync()
		f.Close()
	}
	e.mu.Unlock()
	if err != nil {
		return events.ActionOutcome{}, err
	}
	time.Sleep(time.Millisecond) // widen the window between intent and result
	return events.ActionOutcome{Status: events.StatusExecuted, Observation: fmt.Sprintf("step %d done", c.StepIdx)}, nil
}

func (e *loggingExecutor) Parameters() map[string]string { return map[string]string{"kind": "logging"} }

func killAgent(store seams.RunStore, runID, execLog string) (engine.Definition, engine.Request) {
	return engine.Definition{Model: &seamstest.Model{Turns: killScript()}, Parser: seamstest.Parser{}, Store: store},
		engine.Request{RunID: runID, Tools: registry, Executor: &loggingExecutor{path: execLog},
			Budget:            engine.Budget{MaxSteps: 100, MaxActions: 100, MaxConsecutiveParseFailures: 2, MaxPromptChars: 1_000_000},
			ModelReplayPolicy: events.ReplaySafe}
}

// runKillChild is the child's whole life: run (or resume) the agent on
// the store (a file or a postgres:// URL). A resuming child prints how
// many appends it made and how it ended: "busy" (engine.ErrRunBusy) or
// the stop reason.
func runKillChild() int {
	ctx := context.Background()
	store, err := stores.Open(ctx, os.Getenv(childStoreEnv), stores.Options{LockTimeout: 10 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 3
	}
	defer store.Close()
	if os.Getenv(childPauseEnv) != "" {
		return runPausingChild(store, os.Getenv(childRunEnv), os.Getenv(childExecEnv))
	}
	counted := &countingStore{RunStore: store}
	def, req := killAgent(counted, os.Getenv(childRunEnv), os.Getenv(childExecEnv))
	if os.Getenv(childModeEnv) == "resume" {
		res, err := engine.Resume(ctx, def, req)
		switch {
		case errors.Is(err, engine.ErrRunBusy):
			fmt.Printf("appends=%d busy\n", counted.n.Load())
		case err != nil:
			fmt.Fprintln(os.Stderr, "child:", err)
			return 4
		default:
			fmt.Printf("appends=%d %s\n", counted.n.Load(), res.StopReason)
		}
		return 0
	}
	if _, err := engine.Run(ctx, def, req); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 4
	}
	return 0
}

// TestRealCrashSIGKILL: children running on a bbolt file are killed
// mid-run; the parent resumes each run.
func TestRealCrashSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	dir := t.TempDir()
	killAndResume(t, dir, filepath.Join(dir, "kill.db"), false)
}

// TestRealCrashSIGKILLPostgres: children running on PostgreSQL are killed
// mid-run; two other processes then resume each run at once, and exactly
// one of them continues it.
func TestRealCrashSIGKILLPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	killAndResume(t, t.TempDir(), pgtest.StoreURL(t), true)
}

// killAndResume kills children running the kill agent on storePath (a
// file or URL) and resumes each run: in this process, or (racing) in two
// child processes at once.
func killAndResume(t *testing.T, dir, storePath string, racing bool) {
	ctx := context.Background()
	if stores.IsPostgres(storePath) { // create the schema before the children race to
		s, err := stores.Open(ctx, storePath, stores.Options{})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
	}

	refStore := &seamstest.MemStore{}
	refDef, refReq := killAgent(refStore, "ref", filepath.Join(dir, "ref.log"))
	want, err := engine.Run(ctx, refDef, refReq)
	if err != nil || want.StopReason != events.StopAgentFinished {
		t.Fatalf("reference: %v %v", want.StopReason, err)
	}

	child := func(runID, execLog, mode string) (*exec.Cmd, *strings.Builder, *strings.Builder) {
		childStore := storePath
		if stores.IsPostgres(storePath) && mode == "run" { // its sessions, to wait for once it is killed
			childStore += "&application_name=" + sessionName(runID)
		}
		if stores.IsPostgres(storePath) { // a killed child's lease expires soon
			childStore += "&" + pgstore.LeaseParam + "=" + killLease.String()
		}
		return startChild(t, childStore, runID, execLog, mode)
	}
	// Kills are placed by the child's progress, not by the clock, so they
	// land mid-run however fast this machine is: wait until the child has
	// executed k actions (its execution log has k lines), then a random
	// moment of up to 3 ms more. 5 kills, 20 under POLYLOOP_SOAK=1.
	wantKills := soak.Count(5, 20)
	kills, unknown, lingering, committedLate := 0, 0, 0, 0
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	for attempt := 0; kills < wantKills; attempt++ {
		if attempt >= 3*wantKills {
			t.Fatalf("only %d of %d attempts killed a child mid-run", kills, attempt)
		}
		runID := fmt.Sprintf("k%03d", attempt)
		execLog := filepath.Join(dir, runID+".log")
		cmd, _, stderr := child(runID, execLog, "run")
		waitForActions(execLog, rng.IntN(killSteps*3/5), 20*time.Second)
		time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
		cmd.Process.Signal(syscall.SIGKILL)
		err := cmd.Wait()
		if err == nil && !strings.Contains(stderr.String(), "child:") {
			continue // finished before the kill
		}
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
			t.Fatalf("child failed on its own: %v\n%s", err, stderr.String())
		}
		if stores.IsPostgres(storePath) {
			// The dead child's server session outlives it until the server
			// notices, and a COMMIT it had sent may still commit: what it
			// left is judged only once its sessions are gone. early is the
			// stream as a reader saw it at once, to count how often that
			// was not yet what the child left.
			early := loadNow(t, storePath, runID)
			n, err := waitSessionsGone(ctx, storePath, sessionName(runID), 30*time.Second)
			if err != nil {
				t.Fatalf("kill %d: %v", kills, err)
			}
			if n > 0 {
				lingering++
			}
			if loadNow(t, storePath, runID) != early {
				committedLate++
			}
		}

		store, err := stores.Open(ctx, storePath, stores.Options{})
		if err != nil {
			t.Fatalf("kill %d left a store that does not open: %v", kills, err)
		}
		// The dead child's lease holds the run until it expires: a
		// worker taking the run over waits that long at most.
		if err := waitUnleased(store, runID, 10*killLease); err != nil {
			t.Fatalf("kill %d: %v", kills, err)
		}
		stream, err := store.Load(ctx, runID)
		if err != nil {
			t.Fatalf("kill %d: load: %v", kills, err)
		}
		verdict, err := recovery.Classify(runID, stream)
		if err != nil {
			t.Fatalf("kill %d left a corrupt log: %v", kills, err)
		}
		if verdict.State == recovery.Finished {
			store.Close()
			continue // killed after the last write
		}
		kills++
		def, req := killAgent(store, runID, execLog)
		var got events.RunResult
		switch {
		case len(stream) == 0:
			got, err = engine.Run(ctx, def, req)
		case racing:
			err = raceResumes(t, child, runID, execLog)
			if err == nil {
				got, err = engine.Resume(ctx, def, req) // the stored result
			}
		default:
			got, err = engine.Resume(ctx, def, req)
		}
		store.Close()
		if err != nil {
			t.Fatalf("kill %d (%s): resume: %v", kills, verdict.State, err)
		}
		inDoubtNever := verdict.InDoubt != nil && verdict.InDoubt.ReplayPolicy == events.ReplayNever
		switch {
		case inDoubtNever:
			unknown++
			if got.StopReason != events.StopResumeStateUnknown || len(got.Steps) != verdict.Step {
				t.Fatalf("kill %d: never action in doubt, resumed to %s", kills, got.StopReason)
			}
		case got.StopReason != want.StopReason || !proptest.SameSteps(got.Steps, want.Steps):
			t.Fatalf("kill %d (%s at step %d): resumed to %s after %d steps, want %s after %d",
				kills, verdict.State, verdict.Step, got.StopReason, len(got.Steps), want.StopReason, len(want.Steps))
		}
		checkExecLog(t, execLog)
	}
	t.Logf("%d children killed mid-run and resumed; %d stopped honestly with resume_state_unknown", kills, unknown)
	if stores.IsPostgres(storePath) {
		t.Logf("%d killed children still had a session on the server when they were reaped; in %d the stream grew after that (a write of the dead child committed late)",
			lingering, committedLate)
	}
	if racing {
		t.Logf("racing resumes: %d continued the run, %d refused with ErrRunBusy, %d found it finished", raceStats.continued, raceStats.busy, raceStats.finished)
	}
}

// startChild starts this test binary as a kill child running (mode "run")
// or resuming runID on store, logging its executions to execLog, with env
// added to its environment.
func startChild(t *testing.T, store, runID, execLog, mode string, env ...string) (*exec.Cmd, *strings.Builder, *strings.Builder) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childStoreEnv+"="+store, childRunEnv+"="+runID, childExecEnv+"="+execLog,
		childModeEnv+"="+mode, "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, &stdout, &stderr
}

// killLease is the lease term of the kill test's children on PostgreSQL.
const killLease = time.Second

// waitUnleased waits until runID can be reserved in store (a dead
// holder's lease expired), for up to limit.
func waitUnleased(store seams.RunStore, runID string, limit time.Duration) error {
	l, ok := store.(seams.RunLocker)
	if !ok {
		return nil
	}
	deadline := time.Now().Add(limit)
	for {
		release, err := l.LockRun(runID)
		if err == nil {
			release()
			return nil
		}
		if !errors.Is(err, seams.ErrRunLocked) || time.Now().After(deadline) {
			return fmt.Errorf("the run is still reserved after %v: %w", limit, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// countingStore counts the appends its store accepted; it reserves runs
// with its store's locks.
type countingStore struct {
	seams.RunStore
	n atomic.Int32
}

func (c *countingStore) LockRun(runID string) (func(), error) {
	return (&proptest.CrashingStore{Inner: c.RunStore}).LockRun(runID)
}

// HoldsRun forwards to its store's leases (seams.RunLeaser): without it
// the engine could not tell that a lease was lost, and a driver paused past
// its lease would execute the action it was about to.
func (c *countingStore) HoldsRun(ctx context.Context, runID string) error {
	return (&proptest.CrashingStore{Inner: c.RunStore}).HoldsRun(ctx, runID)
}

func (c *countingStore) Append(ctx context.Context, runID string, after ulid.ULID, evs ...events.Event) ([]events.Envelope, error) {
	envs, err := c.RunStore.Append(ctx, runID, after, evs...)
	if err == nil {
		c.n.Add(1)
	}
	return envs, err
}

var raceStats struct{ continued, busy, finished int }

// raceResumes resumes runID in two child processes at once and checks that
// exactly one continued it (made appends); the other was refused with
// ErrRunBusy or found the run finished by the first.
func raceResumes(t *testing.T, child func(runID, execLog, mode string) (*exec.Cmd, *strings.Builder, *strings.Builder), runID, execLog string) error {
	type result struct {
		out, errOut *strings.Builder
		err         error
	}
	var cmds [2]*exec.Cmd
	var res [2]result
	for i := range cmds {
		cmds[i], res[i].out, res[i].errOut = child(runID, execLog, "resume")
	}
	for i := range cmds {
		res[i].err = cmds[i].Wait()
	}
	continued := 0
	for _, r := range res {
		if r.err != nil {
			return fmt.Errorf("resuming child: %v\n%s", r.err, r.errOut)
		}
		var appends int
		var end string
		if _, err := fmt.Sscanf(r.out.String(), "appends=%d %s", &appends, &end); err != nil {
			return fmt.Errorf("resuming child printed %q: %v", r.out, err)
		}
		switch {
		case appends > 0:
			continued++
			raceStats.continued++
		case end == "busy":
			raceStats.busy++
		default:
			raceStats.finished++
		}
	}
	if continued != 1 {
		return fmt.Errorf("%d of two resuming processes continued the run: %q, %q", continued, res[0].out, res[1].out)
	}
	return nil
}

// waitForActions waits until the execution log at path has n lines, or
// the limit passes (a slow child is then killed wherever it is).
func waitForActions(path string, n int, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(path)
		if strings.Count(string(b), "\n") >= n {
			return
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// checkExecLog: no result id of a never action appears twice.
func checkExecLog(t *testing.T, path string) {
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		id, policy, _ := strings.Cut(line, " ")
		seen[id]++
		if seen[id] > 1 && policy != string(events.ReplaySafe) {
			t.Fatalf("never action %s executed %d times", id, seen[id])
		}
	}
}

// loadNow is the length of runID's stream at storePath now.
func loadNow(t *testing.T, storePath, runID string) int {
	t.Helper()
	ctx := context.Background()
	s, err := stores.Open(ctx, storePath, stores.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	stream, err := s.Load(ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	return len(stream)
}

// sessionName is the application_name of a killed child's sessions.
func sessionName(runID string) string { return "polyloop-kill-" + runID }

// waitSessionsGone waits until the server at storeURL holds no session
// named name, or limit passes (an error), and returns how many it held when
// first asked.
func waitSessionsGone(ctx context.Context, storeURL, name string, limit time.Duration) (int, error) {
	cfg, err := pgx.ParseConfig(storeURL)
	if err != nil {
		return 0, err
	}
	delete(cfg.RuntimeParams, pgstore.SchemaParam)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	first := -1
	for deadline := time.Now().Add(limit); ; time.Sleep(5 * time.Millisecond) {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, name).Scan(&n); err != nil {
			return 0, err
		}
		if first < 0 {
			first = n
		}
		if n == 0 {
			return first, nil
		}
		if time.Now().After(deadline) {
			return first, fmt.Errorf("%d sessions of the killed child %s still on the server after %s", n, name, limit)
		}
	}
}
