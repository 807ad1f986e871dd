package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/cmd/internal/demo"
	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// demoRun runs the demo's agent to its end as run id on store.
func demoRun(t *testing.T, store seams.RunStore, id string) {
	t.Helper()
	folder, err := demo.Folder()
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(folder)
	def, req, err := demo.Agent(store, folder, id, demo.Replies)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := engine.Run(context.Background(), def, req); err != nil || r.StopReason != events.StopTaskCompleted {
		t.Fatalf("demo run: %v %+v", err, r)
	}
}

// notAForker is a store that does not fork runs.
type notAForker struct{ seams.RunStore }

// TestForkADemoRun: fork forks a demo run at a step under other replies,
// its log saying where it came from; every refusal (a step beyond the
// source's end, a run id taken, no such source, a corrupt one, a store
// that does not fork) is named, exits 1 and writes nothing.
func TestForkADemoRun(t *testing.T) {
	mem := &seamstest.MemStore{}
	demoRun(t, mem, "demo")
	failure := "x"
	if _, err := mem.Append(context.Background(), "corrupt", ulid.ULID{},
		events.RunStarted{RunID: "corrupt", SchemaVersion: events.CurrentSchemaVersion},
		events.ModelCallResult{RunID: "corrupt", ResultID: "orphan", Failure: &failure}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		store   seams.RunStore
		source  string
		step    int
		newID   string
		replies []string
		code    int
		want    string
	}{
		{"a fork under other replies", mem, "demo", 2, "fork-2", []string{`TOOL submit {"answer":"I did not count"}`}, exitOK,
			"forked fork-2 from demo at step 2\nrun fork-2 stopped: task_completed after 3 steps\n"},
		{"a fork with the demo's replies retraces it", mem, "demo", 4, "fork-4", nil, exitOK,
			"run fork-4 stopped: task_completed after 5 steps\n"},
		{"a step beyond the source's end", mem, "demo", 6, "fork-6", nil, exitProblem, `run "demo" has no step 6 to fork at`},
		{"a run id taken", mem, "demo", 1, "fork-2", nil, exitProblem, `run "fork-2" exists in STORE: a fork needs a new run id`},
		{"no such source", mem, "nope", 0, "fork-n", nil, exitProblem, `no run "nope" in STORE`},
		{"a corrupt source", mem, "corrupt", 0, "fork-c", nil, exitProblem, `run "corrupt" is corrupt, and a fork copies only a sound log`},
		{"a store that does not fork", notAForker{mem}, "demo", 1, "fork-x", nil, exitProblem, "STORE does not fork runs"},
	} {
		before, _ := mem.Runs(context.Background())
		var out, errOut strings.Builder
		code := forkRun(context.Background(), c.store, "STORE", c.source, c.step, c.newID, c.replies, &out, &errOut)
		if code != c.code || !strings.Contains(out.String()+errOut.String(), c.want) {
			t.Errorf("%s: exit %d, want %d with %q:\n%s%s", c.name, code, c.code, c.want, out.String(), errOut.String())
		}
		after, _ := mem.Runs(context.Background())
		if c.code != exitOK && len(after) != len(before) {
			t.Errorf("%s: refused, yet %d runs now, %d before", c.name, len(after), len(before))
		}
	}
	stream, err := mem.Load(context.Background(), "fork-2")
	if err != nil {
		t.Fatal(err)
	}
	if o := stream[0].Event.(events.RunStarted).Fork; o == nil || o.Run != "demo" || o.Step != 2 {
		t.Fatalf("fork-2 records %+v", o)
	}
}

// TestForkUsage: fork's arguments are checked before the store is
// opened (exit 2).
func TestForkUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"fork", "s.db", "demo", "1"}, "want STORE SOURCE STEP NEWID"},
		{[]string{"fork", "s.db", "demo", "two", "f"}, `STEP "two": want a step number, 0 or more`},
		{[]string{"fork", "s.db", "demo", "-1", "f"}, "flag provided but not defined: -1"}, // a negative number reads as a flag
		{[]string{"delete", "--reply", "x", "s.db", "r"}, "--reply is not a flag of delete"},
	} {
		if code, out := admin(c.args...); code != exitUsage || !strings.Contains(out, c.want) {
			t.Errorf("%v: exit %d, want 2 with %q:\n%s", c.args, code, c.want, out)
		}
	}
}

// TestForkOnAFile: polyloop-admin fork on a bbolt file holding a demo
// run. It needs kv.Store to fork runs (seams.RunForker); until it does,
// the test skips.
func TestForkOnAFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "demo.db")
	s, err := kv.Open(path, kv.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := any(s).(seams.RunForker); !ok {
		s.Close()
		t.Skip("kv.Store does not implement seams.RunForker yet: polyloop-admin fork on a file is tested once it does")
	}
	demoRun(t, s, "demo")
	s.Close()
	code, out := admin("fork", "--reply", `TOOL submit {"answer":"no idea"}`, path, "demo", "1", "fork-1")
	if code != exitOK || !strings.Contains(out, "forked fork-1 from demo at step 1\nrun fork-1 stopped: task_completed after 2 steps") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if code, out := admin("fork", path, "demo", "9", "fork-9"); code != exitProblem || !strings.Contains(out, `run "demo" has no step 9 to fork at`) {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}
