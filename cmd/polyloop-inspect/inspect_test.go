package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/kv/kvtest"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
	"github.com/polyloop/polyloop/stores"
)

var update = flag.Bool("update", false, "rewrite golden transcripts")

// fixtureStore builds a store holding a finished run, a run stopped at each
// breakpoint of the recovery table, a run with terminal escapes in its
// model output, and a corrupt run.
func fixtureStore(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fixture.db")
	store, err := kv.Open(path, kv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	writeFixture(t, store)
	if err := os.WriteFile(filepath.Join(filepath.Dir(path), "notes.txt"), []byte("not a store\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// writeFixture writes the fixture's runs into store.
func writeFixture(t *testing.T, store seams.RunStore) {
	t.Helper()
	reg, err := seams.NewRegistry(
		seams.Tool{Spec: seams.ToolSpec{Name: "count", ReplayPolicy: events.ReplaySafe},
			Handler: func(context.Context, map[string]any) (string, error) { return "3 files", nil }},
		seams.Tool{Spec: seams.ToolSpec{Name: "pay"},
			Handler: func(context.Context, map[string]any) (string, error) { return "paid", nil }},
		seams.Tool{Spec: seams.ToolSpec{Name: "submit", CompletesRun: true},
			Handler: func(context.Context, map[string]any) (string, error) { return "ok", nil }},
		seams.Tool{Spec: seams.ToolSpec{Name: "python"},
			Handler: func(context.Context, map[string]any) (string, error) {
				return "", seams.EnvFailure(errors.New(`exec: "/nonexistent/python": stat /nonexistent/python: no such file or directory`))
			}},
	)
	if err != nil {
		t.Fatal(err)
	}
	run := func(id string, crashAfter int, policy events.ReplayPolicy, turns ...seamstest.Turn) {
		def := engine.Definition{Model: &seamstest.Model{Turns: turns}, Parser: seamstest.Parser{},
			Store: &proptest.CrashingStore{Inner: store, After: crashAfter}}
		_, err := engine.Run(context.Background(), def, engine.Request{
			RunID: id, Budget: engine.Budget{MaxSteps: 5, MaxActions: 5, MaxConsecutiveParseFailures: 2, MaxPromptChars: 10_000},
			Tools: reg, Executor: reg.Executor(), ModelReplayPolicy: policy, OneEventPerTransaction: true,
			Context: engine.Context{GoalLevel: []seams.Message{seams.Text(seams.RoleUser, "count, pay, submit")}},
		})
		if crashAfter < 0 && err != nil || crashAfter >= 0 && !errors.Is(err, proptest.ErrCrashed) {
			t.Fatalf("fixture %s: %v", id, err)
		}
		time.Sleep(2 * time.Millisecond) // runs lists newest first: no two runs start in one millisecond
	}
	tools := seamstest.Replies(`TOOL count {}`, `hmm`, `TOOL pay {"amount":5}`, `TOOL submit {}`)
	run("a-finished", -1, events.ReplaySafe, tools...)
	run("b-model-call-unknown", 2, events.ReplayNever, tools...)
	run("c-known-failure", 3, events.ReplaySafe, seamstest.Turn{Err: errors.New("503 upstream")})
	run("d-reply-stored", 3, events.ReplaySafe, tools...)
	run("e-safe-action-unknown", 4, events.ReplaySafe, tools...)
	run("f-between-steps", 5, events.ReplaySafe, tools...)
	run("g-never-action-unknown", 11, events.ReplaySafe, tools...)
	run("h-escapes", -1, events.ReplaySafe, seamstest.Replies("FINAL: \x1b[31mred\x1b[0m \u202egnp.exe")...)
	run("i-env-error", -1, events.ReplaySafe, seamstest.Replies(`TOOL python {}`)...)
	in, out, cached := int64(900), int64(40), int64(512)
	run("j-usage", -1, events.ReplaySafe,
		seamstest.Turn{Reply: events.ModelReply{Content: `TOOL count {}`, Usage: &events.Usage{InputTokens: &in, OutputTokens: &out, CachedInputTokens: &cached}}},
		seamstest.Turn{Reply: events.ModelReply{Content: `FINAL: 3 files`}})

	writeDecisions(t, store)

	// A corrupt log: kv keeps only the start/finish rules, so a result
	// without its intent and a gap in the steps can be written directly.
	ctx := context.Background()
	v := events.CurrentSchemaVersion
	failure := "x"
	if _, err := store.Append(ctx, "z-corrupt", ulid.ULID{},
		events.RunStarted{RunID: "z-corrupt", SchemaVersion: v},
		events.ModelCallResult{RunID: "z-corrupt", ResultID: "orphan", Failure: &failure},
		events.Intent{RunID: "z-corrupt", IntentKind: events.IntentModelCall, CallIndex: 2, ResultID: "m2", ReplayPolicy: events.ReplaySafe},
	); err != nil {
		t.Fatal(err)
	}
}

// writeDecisions writes the fixture's runs of human decisions: a refund
// awaiting approval (k); a pay a crash left in doubt, awaiting an
// operator's finding (l); a refund rejected (m), a pay found executed
// (n) and a refund approved with edited arguments (o), each then run to
// its end.
func writeDecisions(t *testing.T, store seams.RunStore) {
	t.Helper()
	ctx := context.Background()
	amount := map[string]any{"type": "object", "required": []string{"amount"}, "additionalProperties": false,
		"properties": map[string]any{"amount": map[string]any{"type": "number", "maximum": 500}}}
	reg, err := seams.NewRegistry(
		seams.Tool{Spec: seams.ToolSpec{Name: "refund", RequiresApproval: true, Parameters: amount},
			Handler: func(_ context.Context, a map[string]any) (string, error) {
				return fmt.Sprintf("refunded %v", a["amount"]), nil
			}},
		seams.Tool{Spec: seams.ToolSpec{Name: "pay", Parameters: amount},
			Handler: func(_ context.Context, a map[string]any) (string, error) {
				return fmt.Sprintf("paid %v", a["amount"]), nil
			}},
	)
	if err != nil {
		t.Fatal(err)
	}
	// drive starts or resumes id, crashing after crashAfter appends (-1:
	// never); the model first asks for call, then answers.
	drive := func(id string, crashAfter int, awaitResolution bool, call string) error {
		var s seams.RunStore = store
		if crashAfter >= 0 {
			s = &proptest.CrashingStore{Inner: store, After: crashAfter}
		}
		def := engine.Definition{Model: &seamstest.Model{Turns: seamstest.Replies(call, `FINAL: done`)}, Parser: seamstest.Parser{}, Store: s}
		req := engine.Request{RunID: id, Tools: reg, Executor: reg.Executor(), ModelReplayPolicy: events.ReplaySafe,
			OneEventPerTransaction: true, AwaitResolution: awaitResolution,
			Budget:  engine.Budget{MaxSteps: 5, MaxActions: 5, MaxConsecutiveParseFailures: 2, MaxPromptChars: 10_000},
			Context: engine.Context{GoalLevel: []seams.Message{seams.Text(seams.RoleUser, "refund or pay")}}}
		_, err := engine.Resume(ctx, def, req)
		if errors.Is(err, engine.ErrRunNotFound) {
			_, err = engine.Run(ctx, def, req)
		}
		return err
	}
	must := func(what string, err error, want error) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Fatalf("fixture %s: %v, want %v", what, err, want)
		}
	}
	// awaited is the call id of the run's last action intent.
	awaited := func(id string) string {
		stream, err := store.Load(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		for i := len(stream) - 1; i >= 0; i-- {
			if in, ok := stream[i].Event.(events.Intent); ok && in.IntentKind == events.IntentAction {
				return in.ResultID
			}
		}
		t.Fatalf("fixture %s: no action", id)
		return ""
	}
	const refund, pay = `TOOL refund {"amount":250}`, `TOOL pay {"amount":5}`
	must("k", drive("k-awaiting-approval", -1, false, refund), engine.ErrAwaitingDecision)
	time.Sleep(2 * time.Millisecond)
	// run_started, model intent, model result, action intent: the pay
	// runs, its outcome is never written.
	must("l", drive("l-awaiting-resolution", 4, true, pay), proptest.ErrCrashed)
	must("l resumed", drive("l-awaiting-resolution", -1, true, pay), engine.ErrAwaitingDecision)
	time.Sleep(2 * time.Millisecond)
	must("m", drive("m-rejected", -1, false, refund), engine.ErrAwaitingDecision)
	_, err = engine.Decide(ctx, store, events.Decision{RunID: "m-rejected", ResultID: awaited("m-rejected"), Verdict: events.VerdictRejected,
		By: "bo", Note: "the order was never paid"})
	must("m decided", err, nil)
	must("m resumed", drive("m-rejected", -1, false, refund), nil)
	time.Sleep(2 * time.Millisecond)
	must("n", drive("n-resolved", 4, false, pay), proptest.ErrCrashed)
	seen := "payment p-7 is in the ledger"
	_, err = engine.Resolve(ctx, store, events.Decision{RunID: "n-resolved", ResultID: awaited("n-resolved"), Verdict: events.VerdictExecuted,
		By: "ops", Observation: &seen})
	must("n resolved", err, nil)
	must("n resumed", drive("n-resolved", -1, false, pay), nil)
	time.Sleep(2 * time.Millisecond)
	must("o", drive("o-approved-edited", -1, false, refund), engine.ErrAwaitingDecision)
	edited := `{"amount":120}`
	_, err = engine.Decide(ctx, store, events.Decision{RunID: "o-approved-edited", ResultID: awaited("o-approved-edited"),
		Verdict: events.VerdictApproved, By: "ana", Note: "half was a gift card", Arguments: &edited})
	must("o decided", err, nil)
	must("o resumed", drive("o-approved-edited", -1, false, refund), nil)
	time.Sleep(2 * time.Millisecond)
}

var (
	ulidPattern  = regexp.MustCompile(`\b[0-9A-HJKMNP-TV-Z]{26}\b`)
	timePattern  = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z`)
	clockPattern = regexp.MustCompile(`\b\d\d:\d\d:\d\dZ`) // report.Clock's on the day
	wallPattern  = regexp.MustCompile(`"step_wall_ms":\d+`)
	spacePattern = regexp.MustCompile(` {2,}`)
)

// normalise hides what differs between runs: ULIDs, times (a listing's
// times of day too), wall clock
// milliseconds, the temporary path, and column widths that follow them.
func normalise(s, path string) string {
	s = strings.ReplaceAll(s, stores.Describe(path), "FIXTURE") // as messages name it
	s = strings.ReplaceAll(s, path, "FIXTURE")
	s = strings.ReplaceAll(s, filepath.Dir(path), "DIR")
	s = ulidPattern.ReplaceAllString(s, "ULID")
	s = timePattern.ReplaceAllString(s, "TIME")
	s = clockPattern.ReplaceAllString(s, "CLOCK")
	s = wallPattern.ReplaceAllString(s, `"step_wall_ms":N`)
	s = spacePattern.ReplaceAllString(s, "  ")
	// The WALL MS column of step tables.
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if f := strings.Split(l, "  "); len(f) == 9 && stepRow.MatchString(l) {
			f[7] = "N"
			lines[i] = strings.Join(f, "  ")
		}
	}
	return strings.Join(lines, "\n")
}

var stepRow = regexp.MustCompile(`^\d+  (ok|failed)  `)

// TestTranscripts runs each command in-process against the fixture store
// and compares output and exit status with testdata/transcripts.golden.
func TestTranscripts(t *testing.T) {
	path := fixtureStore(t)
	got := transcript(path, transcriptCases(path))
	golden := filepath.Join("testdata", "transcripts.golden")
	if *update {
		os.MkdirAll("testdata", 0o755)
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

// transcript runs each command in-process and returns what it printed and
// its exit status, normalised.
func transcript(path string, cases [][]string) string {
	var all bytes.Buffer
	for _, args := range cases {
		var out, errOut bytes.Buffer
		code := run(args, &out, &errOut)
		stderr := ""
		if e := strings.TrimSuffix(errOut.String(), "\n"); e != "" {
			stderr = "stderr> " + strings.ReplaceAll(e, "\n", "\nstderr> ") + "\n"
		}
		fmt.Fprintf(&all, "$ polyloop-inspect %s\n%s%s[exit %d]\n\n", strings.Join(args, " "), out.String(), stderr, code)
	}
	return normalise(all.String(), path)
}

// transcriptCases are the commands run against the fixture store at path.
func transcriptCases(path string) [][]string {
	dir := filepath.Dir(path)
	return [][]string{
		{"runs", path},
		{"runs", "--json", path},
		{"runs", path, "--status", "in_doubt", "--status", "corrupt"},
		{"runs", "--stop-reason", "task_completed", path},
		{"runs", "--limit", "2", path},
		{"runs", "--since", "2000-01-01T00:00:00Z", "--status", "finished", path},
		{"runs", "--since", "2999-01-01T00:00:00Z", path},
		{"runs", "--status", "bogus", path},
		{"runs", "--since", "yesterday", path},
		{"verify", path},
		{"verify", "--json", path},
		{"verify", path, "a-finished"},
		{"verify", path, "g-never-action-unknown"},
		{"verify", path, "no-such-run"},
		{"runs", path, "--status", "awaiting_approval", "--status", "awaiting_resolution"},
		{"runs", "--json", "--status", "awaiting_approval", path},
		{"verify", path, "k-awaiting-approval"},
		{"verify", "--json", path, "k-awaiting-approval"},
		{"verify", path, "l-awaiting-resolution"},
		{"events", path, "k-awaiting-approval"},
		{"steps", path, "k-awaiting-approval"},
		{"events", path, "l-awaiting-resolution"},
		{"events", path, "m-rejected"},
		{"events", path, "n-resolved"},
		{"events", path, "o-approved-edited"},
		{"steps", path, "m-rejected"},
		{"events", path, "a-finished"},
		{"events", "--json", path, "c-known-failure"},
		{"steps", path, "a-finished"},
		{"steps", path, "a-finished", "--json"},
		{"steps", path, "h-escapes"},
		{"steps", path, "i-env-error"},
		{"steps", path, "j-usage"},
		{"verify", path, "i-env-error"},
		{"events", path, "h-escapes"},
		{"events", path, "no-such-run"},
		{"events", "--follow", path, "no-such-run"},
		{"steps", "--json", path, "no-such-run"},
		{"export", "--run", "a-finished", "--run", "h-escapes", path},
		{"export", "--run", "a-finished", "--run", "z-corrupt", path},
		{"runs"},
		{"frobnicate"},
		{"steps", "--yaml", path, "a-finished"},
		{"--help"},
		{"runs", "--help"},
		{"events", "-h"},
		{"steps", "--help"},
		{"verify", "--help"},
		{"export", "--help"},
		{"runs", filepath.Join(dir, "missing.db")},
		{"runs", dir},
		{"verify", "--json", filepath.Join(dir, "notes.txt")},
	}
}

// TestHeldStoreGivesAClearMessage: a store open for writing by a writer
// that does not answer readers on its socket is reported with who holds
// it (here: this process; kv's tests hold it from another) and why
// nothing answers, not waited on forever. (A writer that serves readers is
// read through its socket: process_test.go.)
func TestHeldStoreGivesAClearMessage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "held.db")
	s, err := kv.Open(path, kv.Options{NoServe: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	old := lockWait
	lockWait = 50 * time.Millisecond
	defer func() { lockWait = old }()
	var out bytes.Buffer
	if code := run([]string{"runs", path}, &out, &out); code != exitProblem {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(out.String(), "held for writing") || !strings.Contains(out.String(), "this process") ||
		!strings.Contains(out.String(), "does not answer readers on its socket") {
		t.Fatalf("message: %s", out.String())
	}
}

// TestInspectNeverWrites: the store file is byte-identical after every
// command.
func TestInspectNeverWrites(t *testing.T) {
	path := fixtureStore(t)
	before, _ := os.ReadFile(path)
	for _, args := range [][]string{{"runs", path}, {"verify", path}, {"events", path, "a-finished"}, {"steps", "--json", path, "a-finished"}} {
		var out bytes.Buffer
		run(args, &out, &out)
	}
	after, _ := os.ReadFile(path)
	if !bytes.Equal(before, after) {
		t.Fatal("inspect changed the store file")
	}
}

func TestEscapeNeutralisesTerminalSequences(t *testing.T) {
	cases := map[string]string{
		"plain ✓":            "plain ✓",
		"\x1b[2J":            `\x1b[2J`,
		"a\nb\tc\r":          `a\nb\tc\r`,
		"\u202eevil":         `\u202eevil`,
		"bell\x07":           `bell\x07`,
		"\u009b31m (C1 CSI)": `\x9b31m (C1 CSI)`,
		string([]byte{0xff}): `\ufffd`,
	}
	for in, want := range cases {
		if got := escape(in); got != want {
			t.Errorf("escape(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestVerifyRefusesAStoredValueThatWasAltered: one byte of one stored
// value changed (bbolt's structure intact): verify names the damaged event
// and exits 1, as Resume would refuse.
func TestVerifyRefusesAStoredValueThatWasAltered(t *testing.T) {
	path := fixtureStore(t)
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		// The store's log holds every run's events: alter the first that
		// names the run.
		b := tx.Bucket([]byte("log"))
		c := b.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if bytes.Contains(v, []byte("a-finished")) {
				v = bytes.Replace(v, []byte("a-finished"), []byte("a-finishee"), 1)
				return b.Put(append([]byte(nil), k...), v)
			}
		}
		return errors.New("no event of a-finished in the log")
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if code := run([]string{"verify", path, "a-finished"}, &out, &out); code != exitProblem {
		t.Fatalf("exit %d:\n%s", code, out.String())
	}
	if !strings.Contains(out.String(), "corrupt") || !strings.Contains(out.String(), "checksum mismatch") {
		t.Fatalf("verify does not report the damage:\n%s", out.String())
	}
}

// TestExportIsOneTable: export's rows are the eighteen StepRecord fields
// plus run_id, for every step of every sound run, so they load as one
// table; steps --json stays exactly the eighteen.
func TestExportIsOneTable(t *testing.T) {
	path := fixtureStore(t)
	var out, errOut bytes.Buffer
	code := run([]string{"export", path}, &out, &errOut)
	if code != exitProblem || !strings.Contains(errOut.String(), `run "z-corrupt" is corrupt`) {
		t.Fatalf("exit %d, stderr %s", code, errOut.String())
	}
	var steps bytes.Buffer
	if code := run([]string{"steps", "--json", path, "a-finished"}, &steps, &errOut); code != exitOK {
		t.Fatalf("steps: exit %d", code)
	}
	var one map[string]any
	if err := json.Unmarshal(bytes.SplitN(steps.Bytes(), []byte("\n"), 2)[0], &one); err != nil || len(one) != 18 {
		t.Fatalf("steps --json row has %d keys (%v)", len(one), err)
	}
	perRun := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var row map[string]any
		if err := json.Unmarshal([]byte(line), &row); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		if len(row) != 19 || !strings.HasPrefix(line, `{"run_id":`) {
			t.Fatalf("row has %d keys: %s", len(row), line)
		}
		for k := range one {
			if _, ok := row[k]; !ok {
				t.Fatalf("row lacks %s: %s", k, line)
			}
		}
		perRun[row["run_id"].(string)]++
	}
	want := map[string]int{"a-finished": 4, "f-between-steps": 1, "g-never-action-unknown": 2, "h-escapes": 1, "i-env-error": 1, "j-usage": 2,
		"m-rejected": 2, "n-resolved": 2, "o-approved-edited": 2}
	if !reflect.DeepEqual(perRun, want) {
		t.Fatalf("steps per run %v, want %v", perRun, want)
	}
}

// TestAStoreThatCannotBeOpenedIsOneSentence: a server that refuses, a
// missing file, a file that is no store and a file a writer holds without
// answering readers are each said once, naming the store once, without
// package prefixes.
func TestAStoreThatCannotBeOpenedIsOneSentence(t *testing.T) {
	dir := t.TempDir()
	u := kvtest.UnopenableStores(t, dir)
	missing, text, held := u.Missing, u.NotAStore, u.Held
	old := lockWait
	lockWait = 50 * time.Millisecond
	defer func() { lockWait = old }()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"runs", "postgres://u:pw@127.0.0.1:1/db"}, "polyloop-inspect: cannot connect to postgres://u:xxxxx@127.0.0.1:1/db: connection refused\n"},
		{[]string{"runs", missing}, "polyloop-inspect: no store at " + missing + ": no such file or directory\n"},
		{[]string{"verify", text}, "polyloop-inspect: " + text + " is not a PolyLoop store: not a bbolt file (no valid meta page)\n"},
		{[]string{"runs", held}, "polyloop-inspect: " + held + " is held for writing by this process (close that kv.Store first), which does not answer readers on its socket" +
			" (a writer opened with kv.Options.NoServe, or of a version without the socket); stop the writer or retry\n"},
	} {
		var out, errOut bytes.Buffer
		code := run(c.args, &out, &errOut)
		if code != exitProblem || out.String() != "" || errOut.String() != c.want {
			t.Errorf("%q: exit %d\nstdout: %q\nstderr: %q\n  want: %q", c.args, code, out.String(), errOut.String(), c.want)
		}
	}
}
