package main

import (
	"bufio"
	"context"
	"errors"
	"html"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
)

// awaitingFile is a bbolt file holding run "wait", whose refund of 250
// awaits approval; it returns the file and the call.
func awaitingFile(t *testing.T) (string, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "decide.db")
	store, err := kv.Open(path, kv.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	return path, awaitRefund(t, store, &ledger{}, "wait", "")
}

// stopAtOnce makes serve stop as soon as it serves, until the test ends.
func stopAtOnce(t *testing.T) {
	old := interruptCtx
	t.Cleanup(func() { interruptCtx = old })
	interruptCtx = func() (context.Context, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx, cancel
	}
}

// serving runs `polyloop-admin serve` with args until the test ends,
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

// get gets url with the Host header host ("" for the URL's own),
// answering its status and body.
func get(t *testing.T, url, host string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	resp, err := http.DefaultClient.Do(req)
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

// TestServeRecordsDecisions: serve's run page offers approve and reject;
// a finding is refused 409 by engine.Resolve (nothing is in doubt), a
// posted approval is recorded in the file by the --by name
// (engine.Decide), and deciding again is refused 409 (the engine's
// ErrAlreadyDecided), saying why.
func TestServeRecordsDecisions(t *testing.T) {
	path, call := awaitingFile(t)

	base, banner, stop := serving(t, "--by", "ana", path)
	if !strings.Contains(banner, "decisions recorded as ana") || !strings.Contains(banner, "answering to localhost and loopback addresses") {
		t.Errorf("banner %q", banner)
	}
	_, body := get(t, base+"run?id=wait", "")
	token := regexp.MustCompile(`<form method="post" action="decide" id="approve"><input type="hidden" name="token" value="([^"]+)">`).FindStringSubmatch(body)
	if token == nil || !strings.Contains(body, `id="reject"`) {
		t.Fatalf("serve, the run's page offers no approve and reject:\n%s", body)
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

// TestServeAnswersToItsHosts: with --hosts the pages answer to the names
// it gives (comma-separated, blanks ignored) and to no other, localhost
// included: 421, naming the flag.
func TestServeAnswersToItsHosts(t *testing.T) {
	path, _ := awaitingFile(t)
	base, banner, _ := serving(t, "--by", "ana", "--hosts", "viewer.example, ops.example:8080,", path)
	if !strings.Contains(banner, "answering to viewer.example, ops.example:8080;") {
		t.Errorf("banner %q", banner)
	}
	for _, c := range []struct {
		host string
		code int
	}{
		{"viewer.example", http.StatusOK},
		{"ops.example:8080", http.StatusOK},
		{"localhost", http.StatusMisdirectedRequest},
		{"evil.example", http.StatusMisdirectedRequest},
	} {
		code, body := get(t, base+"run?id=wait", c.host)
		if code != c.code {
			t.Errorf("Host %s: %d, want %d\n%s", c.host, code, c.code, body)
		}
		if code == http.StatusMisdirectedRequest && !strings.Contains(body, "polyloop-admin serve --hosts") {
			t.Errorf("Host %s: the refusal does not say which flag names the hosts: %s", c.host, body)
		}
	}
}

// TestServeDecisionsNeedAName: serve without --by is bad usage that says
// what is missing (decisions are recorded by a name, never a guessed
// one), as are serve's flags given to another command, and the store is
// not opened.
func TestServeDecisionsNeedAName(t *testing.T) {
	stopAtOnce(t) // were one served
	path, _ := awaitingFile(t)
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"serve", "--addr", "127.0.0.1:0", path}, "--by NAME is needed"},
		{[]string{"serve", "--by", "ana"}, "want one STORE"},
		{[]string{"serve", "--by", "ana", path, "wait"}, "want one STORE"},
		{[]string{"serve", "--by", "ana", "--note", "x", path}, "--note is not a flag of serve"},
		{[]string{"approve", "--hosts", "viewer.example", path, "wait", "c"}, "--hosts is not a flag of approve"},
		{[]string{"cancel", "--addr", "127.0.0.1:0", path, "wait"}, "--addr is not a flag of cancel"},
	} {
		if code, out := admin(c.args...); code != exitUsage || !strings.Contains(out, c.says) {
			t.Errorf("%q: exit %d, %q; want 2 saying %q", c.args, code, out, c.says)
		}
	}
	if code, out := admin("serve", "--help"); code != exitOK || !strings.Contains(out, "polyloop-admin serve [--addr ADDR] [--hosts H,…] --by NAME STORE") {
		t.Errorf("serve --help: exit %d\n%s", code, out)
	}
}

// TestServeOnAMissingStoreCreatesNothing: serve on a path where no store
// is (a mistyped one) fails naming it, and leaves no empty store behind
// to be served and written.
func TestServeOnAMissingStoreCreatesNothing(t *testing.T) {
	stopAtOnce(t)
	path := filepath.Join(t.TempDir(), "mistyped.db")
	code, out := admin("serve", "--addr", "127.0.0.1:0", "--by", "ana", path)
	if code != exitProblem || !strings.Contains(out, "no store at "+path) {
		t.Errorf("exit %d, %q; want 1 saying there is no store at %s", code, out, path)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("serve left a file at %s: %v", path, err)
	}
}
