package main

import (
	"bufio"
	"context"
	"errors"
	"html"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// awaitingStore is a bbolt file holding run "wait", whose refund call
// awaits approval; it returns the file and the call.
func awaitingStore(t *testing.T) (string, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "decide.db")
	store, err := kv.Open(path, kv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	reg, err := seams.NewRegistry(seams.Tool{Spec: seams.ToolSpec{Name: "refund", RequiresApproval: true,
		Parameters: map[string]any{"type": "object", "required": []string{"amount"}}},
		Handler: func(context.Context, map[string]any) (string, error) { return "refunded", nil }})
	if err != nil {
		t.Fatal(err)
	}
	_, err = engine.Run(context.Background(), engine.Definition{Model: &seamstest.Model{Turns: seamstest.Replies(`TOOL refund {"amount":40}`)},
		Parser: seamstest.Parser{}, Store: store}, engine.Request{RunID: "wait", Tools: reg, Executor: reg.Executor(),
		ModelReplayPolicy: events.ReplaySafe, Budget: engine.Budget{MaxSteps: 5, MaxActions: 5, MaxConsecutiveParseFailures: 2, MaxPromptChars: 10_000}})
	var aw *engine.AwaitingError
	if !errors.As(err, &aw) || len(aw.Calls) != 1 {
		t.Fatalf("the run: %v, want it awaiting approval", err)
	}
	return path, aw.Calls[0].Call
}

// serving runs `polyloop-inspect serve` with args until the test ends,
// returning the viewer's URL and the banner; stop stops it and returns
// its exit status.
func serving(t *testing.T, args ...string) (base, banner string, stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	old := interruptCtx
	interruptCtx = func() (context.Context, context.CancelFunc) { return ctx, func() {} }
	pr, pw := io.Pipe()
	served := make(chan int, 1)
	var errOut strings.Builder
	go func() {
		served <- run(append([]string{"serve", "--addr", "127.0.0.1:0"}, args...), pw, &errOut)
		pw.Close()
	}()
	banner, _ = bufio.NewReader(pr).ReadString('\n')
	go io.Copy(io.Discard, pr)
	base = regexp.MustCompile(`http://[^/]+/`).FindString(banner)
	stopped := false
	stop = func() int {
		if stopped {
			return exitOK
		}
		stopped = true
		cancel()
		code := <-served
		interruptCtx = old
		return code
	}
	t.Cleanup(func() { stop() })
	if base == "" {
		stop()
		t.Fatalf("serve said %q; stderr: %s", banner, errOut.String())
	}
	return base, banner, stop
}

// page gets url, answering its status and body.
func page(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// postForm posts form to url without following a redirect.
func postForm(t *testing.T, url string, form url.Values) (int, string) {
	t.Helper()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.PostForm(url, form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestServeRecordsDecisionsOnlyWhenAllowed: serve is read-only — no
// buttons, a POST refused 405 — unless --allow-decisions; then the run's
// page offers approve and reject, a finding is refused 409 by
// engine.Resolve (nothing is in doubt), a posted approval is recorded in
// the file by the --by name (engine.Decide), and deciding again is refused
// 409 (the engine's ErrAlreadyDecided), saying why.
func TestServeRecordsDecisionsOnlyWhenAllowed(t *testing.T) {
	path, call := awaitingStore(t)

	base, banner, stop := serving(t, path)
	if !strings.Contains(banner, "read-only") {
		t.Errorf("banner %q", banner)
	}
	_, body := page(t, base+"run?id=wait")
	if !strings.Contains(body, `id="pending"`) || strings.Contains(body, "<form method=\"post\"") {
		t.Errorf("read-only serve, the run's page:\n%s", body)
	}
	if code, body := postForm(t, base+"decide", url.Values{"run": {"wait"}, "call": {call}, "verdict": {"approved"}}); code != http.StatusMethodNotAllowed {
		t.Errorf("read-only serve, a POST: %d %s", code, body)
	}
	if code := stop(); code != exitOK {
		t.Fatalf("serve exited %d", code)
	}

	base, banner, stop = serving(t, "--allow-decisions", "--by", "ana", path)
	if !strings.Contains(banner, "decisions recorded as ana") {
		t.Errorf("banner %q", banner)
	}
	_, body = page(t, base+"run?id=wait")
	token := regexp.MustCompile(`<form method="post" action="decide" id="approve"><input type="hidden" name="token" value="([^"]+)">`).FindStringSubmatch(body)
	if token == nil || !strings.Contains(body, `id="reject"`) {
		t.Fatalf("serve --allow-decisions, the run's page offers no approve and reject:\n%s", body)
	}
	// A finding goes to engine.Resolve, which finds nothing in doubt.
	resolve := url.Values{"token": {token[1]}, "run": {"wait"}, "call": {call}, "verdict": {"not_executed"}}
	if code, body := postForm(t, base+"decide", resolve); code != http.StatusConflict || !strings.Contains(body, "its outcome is not in doubt") {
		t.Errorf("a finding on a call awaiting approval: %d %s", code, body)
	}
	approve := url.Values{"token": {token[1]}, "run": {"wait"}, "call": {call}, "verdict": {"approved"}, "note": {"fine"}}
	if code, body := postForm(t, base+"decide", approve); code != http.StatusSeeOther {
		t.Fatalf("the approval: %d %s", code, body)
	}
	if code, body := postForm(t, base+"decide", approve); code != http.StatusConflict || !strings.Contains(html.UnescapeString(body), `already decided: approved by "ana"`) {
		t.Errorf("the approval again: %d %s", code, body)
	}
	if code := stop(); code != exitOK {
		t.Fatalf("serve exited %d", code)
	}

	store, err := kv.Open(path, kv.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	stream, err := store.Load(context.Background(), "wait")
	if err != nil {
		t.Fatal(err)
	}
	if d, ok := stream[len(stream)-1].Event.(events.Decision); !ok || d.By != "ana" || d.Verdict != events.VerdictApproved || d.Note != "fine" || d.ResultID != call {
		t.Fatalf("the file's last event: %#v", stream[len(stream)-1].Event)
	}
}

// TestServeDecisionsNeedAName: --allow-decisions without --by, or --by
// without --allow-decisions, is bad usage that says what is missing.
func TestServeDecisionsNeedAName(t *testing.T) {
	path, _ := awaitingStore(t)
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"--allow-decisions", path}, "--allow-decisions needs --by NAME"},
		{[]string{"--by", "ana", path}, "--by names who decides: it needs --allow-decisions"},
	} {
		var out, errOut strings.Builder
		if code := run(append([]string{"serve", "--addr", "127.0.0.1:0"}, c.args...), &out, &errOut); code != exitUsage || !strings.Contains(errOut.String(), c.says) {
			t.Errorf("%q: exit %d, %q; want 2 saying %q", c.args, code, errOut.String(), c.says)
		}
	}
}
