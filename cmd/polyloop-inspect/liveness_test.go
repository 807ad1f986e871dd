package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
	"github.com/polyloop/polyloop/stores"
)

// coordinated is a store whose listing and Describe name each run's holder
// and queue as set says, the way kv and pgstore fill them.
type coordinated struct {
	*seamstest.MemStore
	set map[string]func(*seams.RunInfo)
}

func (s coordinated) fill(info seams.RunInfo) seams.RunInfo {
	if f := s.set[info.RunID]; f != nil && info.Status != seams.StatusFinished {
		info.Status = seams.StatusRunning
		f(&info)
		info.Liveness(time.Now())
	}
	return info
}

func (s coordinated) Runs(ctx context.Context) ([]seams.RunInfo, error) {
	infos, err := s.MemStore.Runs(ctx)
	for i := range infos {
		infos[i] = s.fill(infos[i])
	}
	return infos, err
}

func (s coordinated) Describe(ctx context.Context, runID string) (seams.RunInfo, error) {
	info, err := s.MemStore.Describe(ctx, runID)
	return s.fill(info), err
}

// livenessStore holds a run for each liveness: driven by a worker whose
// lease is live, its tail an action in doubt (held); interrupted, its
// worker's lease run out (dead); queued for an agent after two failures
// (queued); crashed in an action nobody holds (crashed); finished (done).
func livenessStore(t *testing.T) coordinated {
	// Leases of today, so that they are shown as a time of day: one that
	// runs out at its end, one that ran out at its start.
	y, m, d := time.Now().UTC().Date()
	far, long := time.Date(y, m, d, 23, 59, 59, 0, time.UTC), time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
	s := coordinated{&seamstest.MemStore{}, map[string]func(*seams.RunInfo){
		"held": func(i *seams.RunInfo) { i.Agent, i.Owner, i.LeaseExpires = "reviewer", "host-a/4242/9f3c", far },
		"dead": func(i *seams.RunInfo) { i.Agent, i.Owner, i.LeaseExpires = "reviewer", "host-b/77/0a1b", long },
		"queued": func(i *seams.RunInfo) {
			i.Agent, i.Failures, i.LastError, i.RetryAt = "summariser", 2, "model: 503 upstream", far
		},
		"cancelling": func(i *seams.RunInfo) {
			i.Owner, i.LeaseExpires, i.CancelRequested = "host-a/4242/9f3c", far, &seams.CancelRequest{By: "ops@admin", At: long}
		},
	}}
	for _, id := range []string{"done", "crashed", "queued", "dead", "held", "cancelling"} {
		stream := proptest.SoundStream(id)
		switch id {
		case "crashed", "held":
			stream = stream[:4] // a never action's intent, no outcome
		case "queued", "dead", "cancelling":
			stream = stream[:5] // between steps
		}
		proptest.AppendEach(t, s.MemStore, id, stream)
		time.Sleep(2 * time.Millisecond) // newest first
	}
	return s
}

// TestRunsAndVerifyShowWhoDrivesEachRun: runs lists each run's status,
// agent and holder — running with its holder's lease, interrupted with
// the lease that ran out, awaiting, in_doubt only for a run nobody holds —
// and verify says who drives each unfinished run, with the side effect in
// doubt and what Resume would do only where nobody does
// (testdata/liveness.golden).
func TestRunsAndVerifyShowWhoDrivesEachRun(t *testing.T) {
	s := livenessStore(t)
	var all bytes.Buffer
	for _, cmd := range []struct {
		args []string
		run  func(c *call) int
	}{
		{[]string{"runs"}, func(c *call) int { return c.runsOf(s) }},
		{[]string{"runs", "--status", "running", "--status", "interrupted"}, func(c *call) int {
			c.filter.status = multiFlag{"running", "interrupted"}
			if err := c.filter.check(); err != nil {
				t.Fatal(err)
			}
			return c.runsOf(s)
		}},
		{[]string{"verify"}, func(c *call) int { return c.verifyIn(s) }},
		{[]string{"verify", "held"}, func(c *call) int { c.args = []string{"STORE", "held"}; return c.verifyIn(s) }},
		{[]string{"verify", "--json", "held"}, func(c *call) int {
			c.args, c.json = []string{"STORE", "held"}, true
			return c.verifyIn(s)
		}},
	} {
		var out, errOut bytes.Buffer
		c := &call{stdout: &out, stderr: &errOut, args: []string{"STORE"}}
		code := cmd.run(c)
		fmt.Fprintf(&all, "$ polyloop-inspect %s STORE\n%s%s[exit %d]\n\n", strings.Join(cmd.args, " "), out.String(), errOut.String(), code)
		for _, line := range strings.Split(out.String(), "\n") {
			if n := len([]rune(line)); n > 120 && cmd.args[0] == "runs" {
				t.Errorf("a line of %d columns:\n%s", n, line)
			}
		}
	}
	// No path to hide: the store is in memory, named STORE (which a
	// command it prints names as a file in the working directory).
	got := normalise(strings.ReplaceAll(all.String(), stores.Describe("STORE"), "STORE"), "/nonexistent/store.db")
	golden := filepath.Join("testdata", "liveness.golden")
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -update)", err)
	}
	if got != string(want) {
		t.Errorf("output changed; got:\n%s", got)
	}
}

// syncBuffer is a bytes.Buffer safe to read while a command writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor waits until w holds want, failing t after a while.
func waitFor(t *testing.T, w *syncBuffer, want string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(w.String(), want); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited for %q; got:\n%s", want, w.String())
		}
	}
}

// TestFollowSaysWhenNobodyDrivesTheRun: events --follow of a run nobody
// drives prints its events, says on standard error that nobody drives it
// — once — and goes on following; when a driver takes the run and
// continues it, it says so, prints the new events, and ends with the run.
func TestFollowSaysWhenNobodyDrivesTheRun(t *testing.T) {
	old := followPoll
	followPoll = time.Millisecond
	defer func() { followPoll = old }()
	mem := &seamstest.MemStore{}
	stream := proptest.SoundStream("r")
	proptest.AppendEach(t, mem, "r", stream[:5])
	var out, errOut syncBuffer
	c := &call{stdout: &out, stderr: &errOut, args: []string{"STORE", "r"}}
	done := make(chan int, 1)
	go func() {
		done <- c.followIn(context.Background(), mem, "r", func(env events.Envelope) { fmt.Fprintln(&out, env.Kind) })
	}()
	waitFor(t, &errOut, "\n")
	if want := "polyloop-inspect: run \"r\" is interrupted: nobody drives it (its driver stopped); still following\n"; errOut.String() != want {
		t.Fatalf("stderr %q, want %q", errOut.String(), want)
	}
	if got := strings.Count(out.String(), "\n"); got != 5 {
		t.Fatalf("%d events printed before the run went on, want 5:\n%s", got, out.String())
	}
	time.Sleep(1200 * time.Millisecond) // past a liveness check: nothing new to say
	if strings.Count(errOut.String(), "\n") != 1 {
		t.Fatalf("said again while nothing changed:\n%s", errOut.String())
	}

	release, err := mem.LockRun("r") // a driver takes it and goes on
	if err != nil {
		t.Fatal(err)
	}
	loaded, _ := mem.Load(context.Background(), "r")
	envs, err := mem.Append(context.Background(), "r", loaded[len(loaded)-1].ID, stream[5:8]...)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, &errOut, `polyloop-inspect: run "r" is running again: memstore drives it`+"\n")
	if _, err := mem.Append(context.Background(), "r", envs[len(envs)-1].ID, stream[8:]...); err != nil {
		t.Fatal(err)
	}
	release()
	select {
	case code := <-done:
		if code != exitOK || strings.Count(out.String(), "\n") != len(stream) || !strings.HasSuffix(out.String(), "run_finished\n") {
			t.Fatalf("exit %d, stdout:\n%s", code, out.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the follow did not end with the run")
	}
	if strings.Count(errOut.String(), "\n") != 2 {
		t.Fatalf("stderr:\n%s", errOut.String())
	}
}

// TestVerifyOfARunWhoseEntryIsDamaged: verify RUN of a run whose entry
// Describe finds damaged gives the corrupt verdict from its stream, with
// the reason, as it would without asking who holds the run.
func TestVerifyOfARunWhoseEntryIsDamaged(t *testing.T) {
	mem := &seamstest.MemStore{}
	proptest.AppendEach(t, mem, "r", proptest.SoundStream("r")[:5])
	var out, errOut bytes.Buffer
	c := &call{stdout: &out, stderr: &errOut, args: []string{"STORE", "r"}}
	if code := c.verifyIn(seamstest.EntryDamaged{MemStore: mem}); code != exitProblem || !strings.Contains(out.String(), "r: corrupt (1 problem)\n  - ") ||
		!strings.Contains(out.String(), "fails its checksum") || errOut.Len() != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
}
