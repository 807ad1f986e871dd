package proptest_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
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

// runKillChild is the child's whole life: run the agent on the store file.
func runKillChild() int {
	store, err := kv.Open(os.Getenv(childStoreEnv), kv.Options{LockTimeout: 10 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 3
	}
	defer store.Close()
	def, req := killAgent(store, os.Getenv(childRunEnv), os.Getenv(childExecEnv))
	if _, err := engine.Run(context.Background(), def, req); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 4
	}
	return 0
}

func TestRealCrashSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	dir := t.TempDir()
	storePath := filepath.Join(dir, "kill.db")
	ctx := context.Background()

	refStore := &seamstest.MemStore{}
	refDef, refReq := killAgent(refStore, "ref", filepath.Join(dir, "ref.log"))
	want, err := engine.Run(ctx, refDef, refReq)
	if err != nil || want.StopReason != events.StopAgentFinished {
		t.Fatalf("reference: %v %v", want.StopReason, err)
	}

	child := func(runID, execLog string) (*exec.Cmd, *strings.Builder) {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childStoreEnv+"="+storePath, childRunEnv+"="+runID, childExecEnv+"="+execLog,
			"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, &stderr
	}
	// Kills are placed by the child's progress, not by the clock, so they
	// land mid-run however fast this machine is: wait until the child has
	// executed k actions (its execution log has k lines), then a random
	// moment of up to 3 ms more.
	const wantKills = 20
	kills, unknown := 0, 0
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	for attempt := 0; kills < wantKills; attempt++ {
		if attempt >= 3*wantKills {
			t.Fatalf("only %d of %d attempts killed a child mid-run", kills, attempt)
		}
		runID := fmt.Sprintf("k%03d", attempt)
		execLog := filepath.Join(dir, runID+".log")
		cmd, stderr := child(runID, execLog)
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

		store, err := kv.Open(storePath, kv.Options{})
		if err != nil {
			t.Fatalf("kill %d left a store that does not open: %v", kills, err)
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
		if len(stream) == 0 {
			got, err = engine.Run(ctx, def, req)
		} else {
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
