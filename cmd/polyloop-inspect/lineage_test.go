package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/report"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
	"github.com/polyloop/polyloop/stores"
)

// forkStore holds a source that counts, then pays and submits (never
// actions, at steps 1 and 2); a fork of it at step 1 under another model and a larger
// budget, which answers at once; a fork at step 3 (the source's end) with
// its parameters; and a fork at step 1 of the first fork.
func forkStore(t *testing.T) *seamstest.MemStore {
	t.Helper()
	mem := &seamstest.MemStore{}
	reg, err := seams.NewRegistry(
		seams.Tool{Spec: seams.ToolSpec{Name: "count", ReplayPolicy: events.ReplaySafe},
			Handler: func(context.Context, map[string]any) (string, error) { return "3 files", nil }},
		seams.Tool{Spec: seams.ToolSpec{Name: "pay"},
			Handler: func(context.Context, map[string]any) (string, error) { return "paid", nil }},
		seams.Tool{Spec: seams.ToolSpec{Name: "submit", CompletesRun: true},
			Handler: func(context.Context, map[string]any) (string, error) { return "ok", nil }},
	)
	if err != nil {
		t.Fatal(err)
	}
	agent := func(id string, maxSteps int, replies ...string) (engine.Definition, engine.Request) {
		return engine.Definition{Model: &seamstest.Model{Turns: seamstest.Replies(replies...)}, Parser: seamstest.Parser{}, Store: mem},
			engine.Request{RunID: id, Tools: reg, Executor: reg.Executor(), ModelReplayPolicy: events.ReplaySafe,
				Budget:  engine.Budget{MaxSteps: maxSteps, MaxActions: 5, MaxConsecutiveParseFailures: 2, MaxPromptChars: 10_000},
				Context: engine.Context{GoalLevel: []seams.Message{seams.Text(seams.RoleUser, "count, pay, submit")}}}
	}
	source := []string{`TOOL count {}`, `TOOL pay {"amount":5}`, `TOOL submit {}`}
	def, req := agent("source", 5, source...)
	if _, err := engine.Run(context.Background(), def, req); err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		id, from string
		step     int
		maxSteps int
		replies  []string
	}{
		{"fork-1", "source", 1, 9, []string{"-", "FINAL: no need to pay"}},
		{"fork-3", "source", 3, 5, source},
		{"fork-1-1", "fork-1", 1, 9, []string{"-", "FINAL: still no need"}},
	} {
		time.Sleep(2 * time.Millisecond) // runs lists newest first
		def, req := agent(f.id, f.maxSteps, f.replies...)
		if _, err := engine.Fork(context.Background(), def, req, f.from, f.step); err != nil {
			t.Fatalf("fork %s: %v", f.id, err)
		}
	}
	return mem
}

// TestLineageTranscripts: runs says which run each fork came from and at
// which step; verify, steps and events say it with the differences, the
// never actions the source executed that the fork does not see, and the
// forks of a run; --json carries them; export exports a fork's copied
// steps with its own (testdata/lineage.golden).
func TestLineageTranscripts(t *testing.T) {
	mem := forkStore(t)
	var all bytes.Buffer
	for _, cmd := range []struct {
		args []string
		json bool
		run  func(c *call) int
	}{
		{[]string{"runs"}, false, func(c *call) int { return c.runsOf(mem) }},
		{[]string{"runs", "--json"}, true, func(c *call) int { return c.runsOf(mem) }},
		{[]string{"verify"}, false, func(c *call) int { return c.verifyIn(mem) }},
		{[]string{"verify", "--json", "fork-1"}, true, func(c *call) int { c.args = []string{"STORE", "fork-1"}; return c.verifyIn(mem) }},
		{[]string{"steps", "fork-1"}, false, func(c *call) int { return c.stepsIn(mem, "fork-1") }},
		{[]string{"steps", "source"}, false, func(c *call) int { return c.stepsIn(mem, "source") }},
		{[]string{"events", "fork-1-1"}, false, func(c *call) int { return c.eventsIn(mem, "fork-1-1") }},
		{[]string{"export", "--run", "fork-1"}, false, func(c *call) int { c.runs = multiFlag{"fork-1"}; return c.exportIn(mem) }},
	} {
		var out, errOut bytes.Buffer
		c := &call{stdout: &out, stderr: &errOut, args: []string{"STORE"}, json: cmd.json}
		code := cmd.run(c)
		fmt.Fprintf(&all, "$ polyloop-inspect %s STORE\n%s%s[exit %d]\n\n", strings.Join(cmd.args, " "), out.String(), errOut.String(), code)
		for _, line := range strings.Split(out.String(), "\n") {
			if n := len([]rune(line)); n > 120 && cmd.args[0] == "runs" && !cmd.json {
				t.Errorf("a line of %d columns:\n%s", n, line)
			}
		}
	}
	got := normalise(strings.ReplaceAll(all.String(), stores.Describe("STORE"), "STORE"), "/nonexistent/store.db")
	golden := filepath.Join("testdata", "lineage.golden")
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

// TestVerifyJSONCarriesLineage: verify --json of each run carries where
// it was forked from, what its source executed unseen, and its forks.
func TestVerifyJSONCarriesLineage(t *testing.T) {
	mem := forkStore(t)
	for _, c := range []struct {
		run, from string
		step      int
		unseen    string // source_never_actions_after, as JSON
		forks     string
	}{
		{"source", "", 0, "null", `[{"run":"fork-1","step":1},{"run":"fork-3","step":3}]`},
		{"fork-1", "source", 1, "2", `[{"run":"fork-1-1","step":1}]`},
		{"fork-3", "source", 3, "0", "null"},
		{"fork-1-1", "fork-1", 1, "0", "null"},
	} {
		var out, errOut bytes.Buffer
		cl := &call{stdout: &out, stderr: &errOut, args: []string{"STORE", c.run}, json: true}
		if code := cl.verifyIn(mem); code != exitOK {
			t.Fatalf("%s: exit %d: %s", c.run, code, errOut.String())
		}
		var v struct {
			ForkedFrom *events.ForkOrigin `json:"forked_from"`
			Unseen     json.RawMessage    `json:"source_never_actions_after"`
			Forks      json.RawMessage    `json:"forks"`
		}
		if err := json.Unmarshal(out.Bytes(), &v); err != nil {
			t.Fatal(err)
		}
		if (v.ForkedFrom == nil) != (c.from == "") || v.ForkedFrom != nil && (v.ForkedFrom.Run != c.from || v.ForkedFrom.Step != c.step) ||
			string(v.Unseen) != c.unseen || string(v.Forks) != c.forks {
			t.Errorf("%s: forked_from %+v, unseen %s, forks %s; want %q@%d, %s, %s", c.run, v.ForkedFrom, v.Unseen, v.Forks, c.from, c.step, c.unseen, c.forks)
		}
	}
}

// TestFirstEventOnAFile: on a bbolt file (a seams.RunScanner) a run's
// first event is read by a scan stopped after it: every run's is its
// RunStarted, and a run not in the store has none.
func TestFirstEventOnAFile(t *testing.T) {
	path := fixtureStore(t)
	s, err := stores.Open(context.Background(), path, stores.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, ok := s.(seams.RunScanner); !ok {
		t.Fatalf("%T is no RunScanner: the test would not read one event", s)
	}
	infos, err := s.Runs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range infos {
		env, ok, err := report.FirstEvent(context.Background(), s, info.RunID)
		if rs, isStart := env.Event.(events.RunStarted); err != nil || !ok || !isStart || rs.RunID != info.RunID {
			t.Errorf("%s: %+v %t %v", info.RunID, env, ok, err)
		}
	}
	if _, ok, err := report.FirstEvent(context.Background(), s, "no-such-run"); ok || err != nil {
		t.Errorf("a run not in the store: %t %v", ok, err)
	}
}
