package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// pgURL returns a postgres:// URL of a fresh store on the test server and
// the store opened for writing.
func pgURL(t *testing.T) (string, *pgstore.Store) {
	t.Helper()
	url := pgtest.StoreURL(t)
	s, err := pgstore.Open(context.Background(), url, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return url, s
}

// TestPostgresTranscriptsMatchTheFileStore: every inspector command prints
// the same for the fixture's runs stored in PostgreSQL as for the bbolt
// file (the missing-file case aside; the store's kind in the parameter
// snapshot differs, and the URL is quoted in the commands printed).
func TestPostgresTranscriptsMatchTheFileStore(t *testing.T) {
	url, store := pgURL(t)
	writeFixture(t, store)
	path := fixtureStore(t)
	want := transcript(path, readCases(path))
	got := strings.ReplaceAll(transcript(url, readCases(url)), `"store.kind":"postgres"`, `"store.kind":"bbolt"`)
	// A command printed for a person to run quotes the URL for the shell
	// (its & and ?), where the file's path needs no quotes.
	got = strings.ReplaceAll(got, `'FIXTURE'`, `FIXTURE`)
	if got != want {
		t.Errorf("postgres transcript differs from the file's:\n%s\nfile:\n%s", got, want)
	}
}

// readCases are transcriptCases that read a store.
func readCases(target string) [][]string {
	var out [][]string
	for _, c := range transcriptCases(target) {
		if joined := strings.Join(c, " "); strings.Contains(joined, target) && !strings.Contains(joined, "missing.db") {
			out = append(out, c)
		}
	}
	return out
}

// TestPostgresIsInspectedWhileAnAgentWrites: a run in progress, its store
// open for writing, is listed and verified at once (a bbolt file would be
// held by its writer): running, held by its driver's store.
func TestPostgresIsInspectedWhileAnAgentWrites(t *testing.T) {
	url, store := pgURL(t)
	if _, ok := any(store).(seams.RunDescriber); !ok {
		t.Fatal("pgstore.Store does not implement seams.RunDescriber yet: its listing names no holder, so a run its driver holds reads as nobody's (this test needs pgstore's Runs and Describe to fill RunInfo.Owner and LeaseExpires)")
	}
	model := seamstest.NewPausingModel(&seamstest.Model{Turns: seamstest.Replies(`TOOL count {}`, `FINAL: done`)}, 2)
	def := engine.Definition{Model: model, Parser: seamstest.Parser{}, Store: store}
	reg, err := seams.NewRegistry(seams.Tool{Spec: seams.ToolSpec{Name: "count", ReplayPolicy: events.ReplaySafe},
		Handler: func(context.Context, map[string]any) (string, error) { return "3", nil }})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() {
		_, err := engine.Run(context.Background(), def, engine.Request{RunID: "live", Tools: reg, Executor: reg.Executor(), ModelReplayPolicy: events.ReplaySafe,
			Budget: engine.Budget{MaxSteps: 5, MaxActions: 5, MaxConsecutiveParseFailures: 2, MaxPromptChars: 10_000}})
		done <- err
	}()
	select {
	case <-model.Entered:
	case err := <-done:
		t.Fatalf("the run ended before its second model call: %v", err)
	}
	inspect := func(args ...string) string {
		var out, errOut strings.Builder
		if code := run(args, &out, &errOut); code != exitOK {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out.String(), errOut.String())
		}
		return out.String()
	}
	// Mid-run, between the model call's intent and its result: one step
	// done, a model call in progress — not in doubt, since its driver holds
	// the run (a crash now would leave it in doubt). The listing names the
	// holder: pgstore's Runs and Describe fill Owner and LeaseExpires.
	owner := regexp.QuoteMeta(store.Owner())
	if got := inspect("runs", url); !regexp.MustCompile(`live +running +1 .* ` + owner + ` until (\d{4}-\d\d-\d\dT)?\d\d:\d\d:\d\dZ`).MatchString(got) {
		t.Fatalf("the run in progress is not listed running, held by %s (pgstore's listing must name a run's holder):\n%s", store.Owner(), got)
	}
	if got := inspect("verify", url, "live"); !strings.Contains(got, "live: running, in step 1\n  "+store.Owner()+" drives it (lease until ") ||
		strings.Contains(got, "in doubt") || strings.Contains(got, "resume_state_unknown") {
		t.Fatalf("verify during the run (running, its holder named, nothing in doubt):\n%s", got)
	}
	close(model.Release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := inspect("runs", url); !strings.Contains(got, "finished") {
		t.Fatalf("finished run:\n%s", got)
	}
}

// TestFollowAndServeWhileAnAgentWrites: events --follow prints a running
// run's events as they become durable and ends with run_finished; serve
// answers the viewer's pages for the same store meanwhile.
func TestFollowAndServeWhileAnAgentWrites(t *testing.T) {
	url, store := pgURL(t)
	model := seamstest.NewPausingModel(&seamstest.Model{Turns: seamstest.Replies(`TOOL count {}`, `FINAL: done`)}, 2)
	reg, err := seams.NewRegistry(seams.Tool{Spec: seams.ToolSpec{Name: "count", ReplayPolicy: events.ReplaySafe},
		Handler: func(context.Context, map[string]any) (string, error) { return "3", nil }})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := engine.Run(context.Background(), engine.Definition{Model: model, Parser: seamstest.Parser{}, Store: store},
			engine.Request{RunID: "live", Tools: reg, Executor: reg.Executor(), ModelReplayPolicy: events.ReplaySafe,
				Budget: engine.Budget{MaxSteps: 5, MaxActions: 5, MaxConsecutiveParseFailures: 2, MaxPromptChars: 10_000}})
		done <- err
	}()
	<-model.Entered

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	old := interruptCtx
	interruptCtx = func() (context.Context, context.CancelFunc) { return ctx, func() {} }
	defer func() { interruptCtx = old }()

	followed := make(chan string, 1)
	go func() {
		var out, errOut strings.Builder
		code := run([]string{"events", "--follow", url, "live"}, &out, &errOut)
		followed <- fmt.Sprintf("exit %d\n%s%s", code, out.String(), errOut.String())
	}()
	served := make(chan int, 1)
	pr, pw := io.Pipe()
	go func() {
		var errOut strings.Builder
		served <- run([]string{"serve", "--addr", "127.0.0.1:0", url}, pw, &errOut)
		pw.Close()
	}()
	line, _ := bufio.NewReader(pr).ReadString('\n')
	go io.Copy(io.Discard, pr)
	addr := regexp.MustCompile(`http://[^/]+/`).FindString(line)
	if addr == "" {
		t.Fatalf("serve said %q", line)
	}
	resp, err := http.Get(addr + "run?id=live")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(page), `data-follow=`) {
		t.Fatalf("run page of a live run: %d\n%s", resp.StatusCode, page)
	}

	close(model.Release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	select {
	case out := <-followed:
		if !strings.HasPrefix(out, "exit 0") || !strings.Contains(out, "run_finished") || strings.Count(out, "\n") < 8 {
			t.Fatalf("follow:\n%s", out)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("events --follow did not end with the run")
	}
	cancel()
	if code := <-served; code != exitOK {
		t.Fatalf("serve exited %d", code)
	}
}

// TestPostgresDamageIsFoundStoreWide: a runs row marked finished behind
// the store's back, and events whose runs row is gone, are found by the
// store-wide verify and listed corrupt by runs (both exit 1), as they are
// for verify of the one run.
func TestPostgresDamageIsFoundStoreWide(t *testing.T) {
	cases := []struct{ name, sql, want string }{
		{"a crashed run marked finished", `UPDATE {{runs}} SET status = 'finished' WHERE run_id = 'd'`, "fails its checksum"},
		{"a runs row deleted", `DELETE FROM {{runs}} WHERE run_id = 'd'`, "8 events but no index row"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			url, store := pgURL(t)
			proptest.AppendEach(t, store, "a", proptest.SoundStream("a"))
			proptest.AppendEach(t, store, "d", proptest.SoundStream("d")[:8])
			conn, err := pgx.Connect(context.Background(), pgtest.DSN(t))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			if _, err := conn.Exec(context.Background(), strings.ReplaceAll(c.sql, "{{runs}}", pgx.Identifier{store.Schema(), "runs"}.Sanitize())); err != nil {
				t.Fatal(err)
			}
			inspect := func(args ...string) (int, string) {
				var out, errOut strings.Builder
				code := run(args, &out, &errOut)
				return code, out.String() + errOut.String()
			}
			for _, args := range [][]string{{"verify", url, "d"}, {"verify", url}} {
				if code, out := inspect(args...); code != exitProblem || !strings.Contains(out, "d: corrupt") || !strings.Contains(out, c.want) {
					t.Errorf("%v: exit %d\n%s", args, code, out)
				}
			}
			if code, out := inspect("runs", url); code != exitProblem || !regexp.MustCompile(`(?m)^d +corrupt `).MatchString(out) || !regexp.MustCompile(`(?m)^a +finished `).MatchString(out) {
				t.Errorf("runs: exit %d\n%s", code, out)
			}
			if code, out := inspect("runs", "--json", url); code != exitProblem || !strings.Contains(out, `{"run_id":"d","status":"corrupt"`) {
				t.Errorf("runs --json: exit %d\n%s", code, out)
			}
		})
	}
}

// TestNoCommandShowsAPassword: every command, given a PostgreSQL store in
// each form a connection string takes (a URL, a URL with its scheme in
// capitals, a keyword/value string) with a password — of a server that
// answers, or of one that cannot be reached — never prints the password,
// on standard output or standard error, whatever it has to say.
func TestNoCommandShowsAPassword(t *testing.T) {
	password, forms := pgtest.StoreForms(t)
	if s, err := pgstore.Open(context.Background(), forms[0], pgstore.Options{}); err != nil {
		t.Fatal(err) // the schema, so read-only opens find a store
	} else {
		s.Close()
	}
	const secret = "Pa55-w0rd"
	targets := append(forms,
		"postgres://agent:"+secret+"@127.0.0.1:1/db?sslmode=disable",
		"POSTGRES://agent:"+secret+"@127.0.0.1:1/db?sslmode=disable",
		"host=127.0.0.1 port=1 user=agent password='"+secret+"' sslmode=disable")
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // serve prints its banner and stops at once
	old := interruptCtx
	interruptCtx = func() (context.Context, context.CancelFunc) { return ctx, func() {} }
	defer func() { interruptCtx = old }()
	t.Chdir(t.TempDir())
	for _, target := range targets {
		for _, args := range [][]string{
			{"runs", target}, {"runs", "--json", target},
			{"events", target, "missing"}, {"steps", target, "missing"},
			{"verify", target}, {"verify", "--json", target, "missing"},
			{"export", target}, {"export", "--run", "missing", target},
			{"serve", "--addr", "127.0.0.1:0", target},
		} {
			var out, errOut strings.Builder
			code := run(args, &out, &errOut)
			all := out.String() + errOut.String()
			for _, p := range []string{password, secret} {
				if strings.Contains(all, p) {
					t.Errorf("%q: exit %d, the password shows:\n%s", args, code, all)
				}
			}
			if code != exitOK && !strings.Contains(all, "xxxxx") && !strings.Contains(all, "no run") {
				t.Errorf("%q: exit %d without naming the store:\n%s", args, code, all)
			}
		}
	}
}
