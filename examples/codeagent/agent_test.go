package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/projections"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

func execute(t *testing.T, s *sandbox, code string) events.ActionOutcome {
	t.Helper()
	out, err := s.Execute(context.Background(), seams.ActionCall{RunID: "t", Action: seams.Action{Text: code}})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestSandbox(t *testing.T) {
	s := &sandbox{Interpreter: "sh", Timeout: 300 * time.Millisecond, MaxChars: 20, Done: "TASK_COMPLETE", Root: t.TempDir()}
	if out := execute(t, s, "echo one > f; cat f"); out.Observation != "one\n" || out.EnvReportedCompletion {
		t.Errorf("plain: %+v", out)
	}
	if out := execute(t, s, "cat f"); out.Observation != "one\n" {
		t.Errorf("state does not persist between steps: %+v", out)
	}
	if out := execute(t, s, "echo TASK_COMPLETE"); !out.EnvReportedCompletion {
		t.Errorf("completion not reported: %+v", out)
	}
	if out := execute(t, s, "exit 3"); !strings.Contains(out.Observation, "[exit status 3]") || out.Status != events.StatusExecuted {
		t.Errorf("exit status: %+v", out)
	}
	if out := execute(t, s, "sleep 5"); !strings.Contains(out.Observation, "timed out") {
		t.Errorf("timeout: %+v", out)
	}
	if out := execute(t, s, "printf '%050d' 0"); len(out.Observation) != 20 || out.ObservationTruncatedChars != 30 {
		t.Errorf("truncation: %q, %d cut", out.Observation, out.ObservationTruncatedChars)
	}
	broken := &sandbox{Interpreter: "/nonexistent/interpreter", Timeout: time.Second, MaxChars: 100, Root: t.TempDir()}
	if _, err := broken.Execute(context.Background(), seams.ActionCall{RunID: "t", Action: seams.Action{Text: "x"}}); err == nil {
		t.Error("a missing interpreter is not an environment failure")
	}
}

func cfg(t *testing.T) config {
	return config{store: filepath.Join(t.TempDir(), "ca.db"), runID: "t", interpreter: "sh", workRoot: t.TempDir(), crashAfter: -1}
}

func TestCodeAgentCompletesOffline(t *testing.T) {
	r, err := run(context.Background(), cfg(t))
	if err != nil {
		t.Fatal(err)
	}
	if r.StopReason != events.StopTaskCompleted || len(r.Steps) != 4 || strings.Contains(r.Steps[0].RawOutput, "Output: durable") {
		t.Fatalf("%s after %d steps; raw output %q", r.StopReason, len(r.Steps), r.Steps[0].RawOutput)
	}
}

// TestInterruptedRunResumes: the run is cut off after each durable write in
// turn and resumed; every resume completes the task. Code blocks are
// tool-less actions (policy never), so a crash while one ran stops the run
// honestly instead of running it twice.
func TestInterruptedRunResumes(t *testing.T) {
	for crash := 1; crash < 8; crash++ {
		c := cfg(t)
		store, err := kv.Open(c.store, kv.Options{})
		if err != nil {
			t.Fatal(err)
		}
		model := &seamstest.Model{Turns: seamstest.Replies(script...)}
		def, req := agent(model, &proptest.CrashingStore{Inner: store, After: crash}, c)
		if _, err := engine.Run(context.Background(), def, req); !errors.Is(err, proptest.ErrCrashed) {
			t.Fatalf("crash %d: %v", crash, err)
		}
		def.Store = store
		stream, _ := store.Load(context.Background(), "t")
		verdict, err := recovery.Classify("t", stream)
		if err != nil {
			t.Fatal(err)
		}
		r, err := engine.Resume(context.Background(), def, req)
		store.Close()
		if err != nil {
			t.Fatalf("crash %d: %v", crash, err)
		}
		want := events.StopTaskCompleted
		if verdict.State == recovery.ActionUnknown {
			want = events.StopResumeStateUnknown // a code block may have run: never run it twice
		}
		if r.StopReason != want {
			t.Fatalf("crash %d at %s: %s, want %s", crash, verdict.State, r.StopReason, want)
		}
		t.Logf("crash after %d writes: %s after %d steps", crash, r.StopReason, len(r.Steps))
	}
}

// TestCodeAgentAgainstAnEndpoint: with -url, the agent talks to an
// OpenAI-compatible server (here a local test server replaying the script).
func TestCodeAgentAgainstAnEndpoint(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Messages []struct{ Role, Content string }
		}
		b, _ := io.ReadAll(r.Body)
		json.Unmarshal(b, &req)
		i := int(calls.Add(1)) - 1
		if i >= len(script) || !strings.Contains(req.Messages[1].Content, "notes.txt") {
			http.Error(w, `{"error":{"message":"unexpected request"}}`, 400)
			return
		}
		reply, _ := json.Marshal(script[i])
		fmt.Fprintf(w, `{"id":"chatcmpl-%d","choices":[{"message":{"role":"assistant","content":%s}}]}`, i, reply)
	}))
	defer srv.Close()
	c := cfg(t)
	c.url, c.model = srv.URL+"/v1", "test-model"
	r, err := run(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	if r.StopReason != events.StopTaskCompleted || *r.Steps[0].CallID != "chatcmpl-0" {
		t.Fatalf("%s, call id %v", r.StopReason, r.Steps[0].CallID)
	}
}

// TestTheFirstHourFlow: the README's order — a run, then a crash of the
// same run id — says how to go on instead of a bare "run exists"; -resume
// of an unknown run says to start it; an unreachable endpoint is a failed
// model call, labelled so, and a non-zero exit; a cancelled run finishes
// as cancelled (exit 130).
func TestTheFirstHourFlow(t *testing.T) {
	c := cfg(t)
	if _, err := run(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	c.crashAfter = 3
	if _, err := run(context.Background(), c); !errors.Is(err, engine.ErrRunExists) || !strings.Contains(err.Error(), "-resume") {
		t.Fatalf("second run of one id: %v", err)
	}
	c.crashAfter, c.resume, c.runID = -1, true, "nosuch"
	if _, err := run(context.Background(), c); !errors.Is(err, engine.ErrRunNotFound) || !strings.Contains(err.Error(), "without -resume") {
		t.Fatalf("resume of an unknown run: %v", err)
	}

	c.resume, c.runID, c.url, c.model = false, "offline", "http://127.0.0.1:9/v1", "m"
	r, err := run(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	if r.StopReason != events.StopLLMError || !strings.HasPrefix(statusOf(r.Steps[0]), "model call failed") {
		t.Fatalf("%s, step labelled %q", r.StopReason, statusOf(r.Steps[0]))
	}
	if exitCode(r.StopReason) != 1 || exitCode(events.StopTaskCompleted) != 0 || exitCode(events.StopCancelled) != 130 {
		t.Fatal("exit codes")
	}

	// The run cancelled while the model thinks.
	ctx, cancel := context.WithCancel(context.Background())
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body) // so the server notices the client leaving
		cancel()
		select { // answer nothing until the client gives up
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}))
	defer srv.Close()
	c.url, c.runID = srv.URL+"/v1", "interrupted"
	if r, err := run(ctx, c); err != nil || r.StopReason != events.StopCancelled {
		t.Fatalf("interrupted run: %v %v", r.StopReason, err)
	}
}

// TestCtrlCLeavesTheRunResumable: what main wires Ctrl-C to (the
// definition's interrupt) stops the run unfinished with ErrInterrupted,
// and -resume finishes it.
func TestCtrlCLeavesTheRunResumable(t *testing.T) {
	c := cfg(t)
	pressed := make(chan struct{})
	close(pressed)
	c.interrupt = pressed
	if _, err := run(context.Background(), c); !errors.Is(err, engine.ErrInterrupted) {
		t.Fatalf("run with Ctrl-C pressed: %v, want ErrInterrupted", err)
	}
	c.interrupt, c.resume = nil, true
	r, err := run(context.Background(), c)
	if err != nil || exitCode(r.StopReason) != 0 {
		t.Fatalf("-resume after Ctrl-C: %v %v", r.StopReason, err)
	}
}

// forkedLog is run's log in the store file path: its RunStarted's fork
// origin and its steps.
func forkedLog(t *testing.T, path, run string) (*events.ForkOrigin, []events.StepRecord) {
	t.Helper()
	s, err := kv.Open(path, kv.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	stream, err := s.Load(context.Background(), run)
	if err != nil || len(stream) == 0 {
		t.Fatalf("run %s: %d events, %v", run, len(stream), err)
	}
	return stream[0].Event.(events.RunStarted).Fork, projections.Fold(stream).Trajectory()
}

// TestAForkGoesOnFromTheSourcesStep: -fork-from t -at 2 starts a run
// whose log names t and step 2 and holds t's first two steps as they
// are; it goes on in a copy of t's working directory (notes.txt is there)
// and completes. A step beyond t's end, a taken run id, an unknown source
// and -fork-from with -resume are refused, writing nothing.
func TestAForkGoesOnFromTheSourcesStep(t *testing.T) {
	c := cfg(t)
	if _, err := run(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	fork := c
	fork.runID, fork.forkFrom, fork.at = "t-fork", "t", 2
	r, err := run(context.Background(), fork)
	if err != nil || r.StopReason != events.StopTaskCompleted || len(r.Steps) != 4 {
		t.Fatalf("fork: %v after %d steps, %v", r.StopReason, len(r.Steps), err)
	}
	origin, steps := forkedLog(t, c.store, "t-fork")
	_, source := forkedLog(t, c.store, "t")
	if origin == nil || origin.Run != "t" || origin.Step != 2 {
		t.Fatalf("the fork's RunStarted.Fork is %+v, want t at step 2", origin)
	}
	if !reflect.DeepEqual(steps[:2], source[:2]) {
		t.Fatalf("the fork's first steps\n%+v\ndiffer from its source's\n%+v", steps[:2], source[:2])
	}
	for _, tc := range []struct {
		name             string
		from, onto, want string
		at               int
		resume           bool
		crash            int
		is               error
	}{
		{name: "beyond the end", from: "t", onto: "t-5", at: 5, want: `run "t" has no step 5 to fork at`, is: engine.ErrForkStep},
		{name: "onto a run", from: "t", onto: "t-fork", at: 1, want: `run "t-fork" exists in`, is: engine.ErrRunExists},
		{name: "no source", from: "nosuch", onto: "t-2", at: 0, want: `no run "nosuch" to fork in`, is: engine.ErrRunNotFound},
		{name: "with -resume", from: "t", onto: "t-3", at: 1, resume: true, want: "-fork-from starts a new run and -resume continues one"},
		{name: "-at alone", onto: "t-4", at: 1, want: "-at 1: a step to fork at needs -fork-from RUN"},
		{name: "with -crash-after", from: "t", onto: "t-5", at: 1, crash: 2, want: "-fork-from with -crash-after: the crashing store does not fork runs"},
	} {
		bad := c
		bad.runID, bad.forkFrom, bad.at, bad.resume = tc.onto, tc.from, tc.at, tc.resume
		if tc.crash > 0 {
			bad.crashAfter = tc.crash
		}
		_, err := run(context.Background(), bad)
		if err == nil || !strings.Contains(err.Error(), tc.want) || (tc.is != nil && !errors.Is(err, tc.is)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	if runs, err := openRuns(c.store); err != nil || runs != 2 {
		t.Fatalf("%d runs after the refusals (%v), want t and t-fork", runs, err)
	}
}

func openRuns(path string) (int, error) {
	s, err := kv.Open(path, kv.Options{ReadOnly: true})
	if err != nil {
		return 0, err
	}
	defer s.Close()
	runs, err := s.Runs(context.Background())
	return len(runs), err
}
