package proptest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
	"github.com/polyloop/polyloop/stores"
)

// childPauseEnv makes a kill child pause (zombie_test.go): "model:N:DIR"
// holds its N-th model call, "action:N:DIR" holds it once the action
// intent of model call N is durable, before the action runs. Paused, the
// child creates DIR/paused and waits for DIR/go.
const childPauseEnv = "POLYLOOP_KILL_CHILD_PAUSE"

// pause is a child's pause point: a model wrapper and an event sink that
// hold the run at the point childPauseEnv names.
type pause struct {
	where string
	at    int
	dir   string
	store *countingStore
	// appendsAtPause is the child's append count when it paused.
	appendsAtPause int32
}

func parsePause(v string) (*pause, error) {
	parts := strings.SplitN(v, ":", 3)
	if len(parts) != 3 {
		return nil, fmt.Errorf("%s=%q: want where:n:dir", childPauseEnv, v)
	}
	p := &pause{where: parts[0], dir: parts[2]}
	_, err := fmt.Sscan(parts[1], &p.at)
	return p, err
}

// hold marks the child paused and waits for the parent's go.
func (p *pause) hold() {
	p.appendsAtPause = p.store.n.Load()
	os.WriteFile(filepath.Join(p.dir, "paused"), nil, 0o600)
	for {
		if _, err := os.Stat(filepath.Join(p.dir, "go")); err == nil {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type pausingModel struct {
	seams.ModelClient
	p *pause
}

func (m pausingModel) Call(ctx context.Context, c seams.ModelCall) (events.ModelReply, error) {
	if m.p.where == "model" && c.CallIndex == m.p.at {
		m.p.hold()
	}
	return m.ModelClient.Call(ctx, c)
}

type pausingSink struct{ p *pause }

func (s pausingSink) Emit(_ context.Context, env events.Envelope) error {
	if in, ok := env.Event.(events.Intent); ok && s.p.where == "action" && in.IntentKind == events.IntentAction && in.CallIndex == s.p.at {
		s.p.hold()
	}
	return nil
}

func (pausingSink) Parameters() map[string]string { return nil }

// runPausingChild runs the kill agent with a pause; it prints how many
// appends it made after the pause and how it ended.
func runPausingChild(store seams.RunStore, runID, execLog string) int {
	p, err := parsePause(os.Getenv(childPauseEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	p.store = &countingStore{RunStore: store}
	def, req := killAgent(p.store, runID, execLog)
	def.Model = pausingModel{def.Model, p}
	def.Events = pausingSink{p}
	_, err = engine.Run(context.Background(), def, req)
	after := p.store.n.Load() - p.appendsAtPause
	switch {
	case errors.Is(err, engine.ErrRunBusy):
		fmt.Printf("appends-after-pause=%d busy\n", after)
		fmt.Fprintln(os.Stderr, "child:", err)
	case err != nil:
		fmt.Fprintln(os.Stderr, "child:", err)
		return 4
	default:
		fmt.Printf("appends-after-pause=%d finished\n", after)
	}
	return 0
}

// TestAZombieWorkerDoesNothing: a worker process driving a run on
// PostgreSQL is stopped (SIGSTOP) while it waits on its model, or once an
// action's intent is durable and before the action runs; its lease
// expires, this process takes the run over and finishes it; then the
// stopped worker is continued (SIGCONT). It must append nothing and
// execute nothing more, and end with engine.ErrRunBusy; the log is the
// taker's, sound, and the run's result is what an uninterrupted run gives.
func TestAZombieWorkerDoesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	ctx := context.Background()
	storeURL := pgtest.StoreURL(t)
	s, err := stores.Open(ctx, storeURL, stores.Options{}) // create the schema
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	refDef, refReq := killAgent(&seamstest.MemStore{}, "ref", filepath.Join(t.TempDir(), "ref.log"))
	want, err := engine.Run(ctx, refDef, refReq)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		where string
		at    int // a call whose action is the safe count tool
	}{{"model", 7}, {"action", 10}} {
		t.Run(c.where, func(t *testing.T) {
			dir := t.TempDir()
			runID := "zombie-" + c.where
			childLog, takerLog := filepath.Join(dir, "child.log"), filepath.Join(dir, "taker.log")
			cmd, out, errOut := startChild(t, storeURL+"&"+pgstore.LeaseParam+"="+killLease.String(), runID, childLog, "run",
				childPauseEnv+"="+fmt.Sprintf("%s:%d:%s", c.where, c.at, dir))
			defer cmd.Process.Kill()
			deadline := time.Now().Add(30 * time.Second)
			for {
				if _, err := os.Stat(filepath.Join(dir, "paused")); err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the child never paused: %s", errOut)
				}
				time.Sleep(5 * time.Millisecond)
			}
			if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			executed := lines(t, childLog)

			store, err := stores.Open(ctx, storeURL, stores.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			start := time.Now()
			if err := waitUnleased(store, runID, 10*killLease); err != nil {
				t.Fatal(err)
			}
			t.Logf("the stopped worker's lease expired after %v", time.Since(start).Round(time.Millisecond))
			def, req := killAgent(store, runID, takerLog)
			got, err := engine.Resume(ctx, def, req)
			if err != nil {
				t.Fatalf("taking the run over: %v", err)
			}
			if got.StopReason != want.StopReason || !proptest.SameSteps(got.Steps, want.Steps) {
				t.Fatalf("the taker ended %s after %d steps, want %s after %d", got.StopReason, len(got.Steps), want.StopReason, len(want.Steps))
			}
			before, err := store.Load(ctx, runID)
			if err != nil {
				t.Fatal(err)
			}

			if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("the continued worker: %v\n%s", err, errOut)
			}
			if o := strings.TrimSpace(out.String()); o != "appends-after-pause=0 busy" {
				t.Fatalf("the continued worker printed %q, want it to append nothing and find the run busy\n%s", o, errOut)
			}
			t.Logf("the continued worker: %s", strings.TrimSpace(errOut.String()))
			if n := lines(t, childLog); n != executed {
				t.Fatalf("the continued worker executed %d actions after it was stopped", n-executed)
			}
			after, err := store.Load(ctx, runID)
			if err != nil {
				t.Fatal(err)
			}
			if len(after) != len(before) || after[len(after)-1].ID != before[len(before)-1].ID {
				t.Fatalf("the log changed after the taker finished: %d events, then %d", len(before), len(after))
			}
			if v, err := recovery.Classify(runID, after); err != nil || v.State != recovery.Finished {
				t.Fatalf("the log: %v %v", v.State, err)
			}
			both := filepath.Join(dir, "both.log")
			a, _ := os.ReadFile(childLog)
			b, _ := os.ReadFile(takerLog)
			os.WriteFile(both, append(a, b...), 0o600)
			checkExecLog(t, both)
		})
	}
}

// lines counts the lines of the file at path (0 when it does not exist).
func lines(t *testing.T, path string) int {
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}
