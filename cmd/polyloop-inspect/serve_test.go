package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os"
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

// TestServeOnlyReads: serve is read-only — the run's page shows the
// pending call but no buttons, and a POST is refused 405.
func TestServeOnlyReads(t *testing.T) {
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
}

// TestServeTakesNoDecisions: the flags that made serve a writer are gone
// (polyloop-admin serve records decisions): each is bad usage, and the
// store is not opened.
func TestServeTakesNoDecisions(t *testing.T) {
	path, _ := awaitingStore(t)
	for _, args := range [][]string{
		{"--allow-decisions", path},
		{"--allow-decisions", "--by", "ana", path},
		{"--by", "ana", path},
		{"--hosts", "viewer.example", path},
	} {
		var out, errOut strings.Builder
		if code := run(append([]string{"serve", "--addr", "127.0.0.1:0"}, args...), &out, &errOut); code != exitUsage ||
			!strings.Contains(errOut.String(), "flag provided but not defined") {
			t.Errorf("%q: exit %d, %q; want 2 saying the flag is not serve's", args, code, errOut.String())
		}
	}
}

// TestServeOnAMissingStoreCreatesNothing: serve on a path where no store
// is (a mistyped one) fails naming it, and leaves no file behind.
func TestServeOnAMissingStoreCreatesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mistyped.db")
	// Were it served, it would stop at once.
	old := interruptCtx
	defer func() { interruptCtx = old }()
	interruptCtx = func() (context.Context, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx, cancel
	}
	var out, errOut strings.Builder
	code := run([]string{"serve", "--addr", "127.0.0.1:0", path}, &out, &errOut)
	if code != exitProblem || !strings.Contains(errOut.String(), "mistyped.db") {
		t.Errorf("exit %d, stdout %q, stderr %q; want 1 naming the path", code, out.String(), errOut.String())
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("serve left a file at %s: %v", path, err)
	}
}
