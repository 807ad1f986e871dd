package viewer_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/report"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
	"github.com/polyloop/polyloop/viewer"
)

const evil = `<script>alert("pwned")</script><img src=x onerror=alert(1)>`

var reg = func() *seams.Registry {
	r, err := seams.NewRegistry(
		seams.Tool{Spec: seams.ToolSpec{Name: "read", ReplayPolicy: events.ReplaySafe},
			Handler: func(context.Context, map[string]any) (string, error) { return evil, nil }},
		seams.Tool{Spec: seams.ToolSpec{Name: "pay"},
			Handler: func(context.Context, map[string]any) (string, error) { return "paid", nil }},
		seams.Tool{Spec: seams.ToolSpec{Name: "python"},
			Handler: func(context.Context, map[string]any) (string, error) {
				return "", seams.EnvFailure(errors.New("exec: python: not found"))
			}},
		seams.Tool{Spec: seams.ToolSpec{Name: "refund", RequiresApproval: true, Parameters: map[string]any{"type": "object",
			"properties": map[string]any{"amount": map[string]any{"type": "number", "maximum": 500}}, "required": []string{"amount"}}},
			Handler: func(_ context.Context, args map[string]any) (string, error) {
				return fmt.Sprintf("refunded %v", args["amount"]), nil
			}},
	)
	if err != nil {
		panic(err)
	}
	return r
}()

// request is the fixtures' request for run id: reg's tools, small budgets.
func request(id string) engine.Request {
	return engine.Request{RunID: id, Tools: reg, Executor: reg.Executor(), ModelReplayPolicy: events.ReplaySafe,
		Budget: engine.Budget{MaxSteps: 5, MaxActions: 5, MaxConsecutiveParseFailures: 2, MaxPromptChars: 100_000}}
}

func runOn(t *testing.T, store seams.RunStore, id string, crashAfter int, turns ...string) {
	t.Helper()
	var s seams.RunStore = store
	if crashAfter >= 0 {
		s = &proptest.CrashingStore{Inner: store, After: crashAfter}
	}
	_, err := engine.Run(context.Background(), engine.Definition{Model: &seamstest.Model{Turns: seamstest.Replies(turns...)},
		Parser: seamstest.Parser{}, Store: s}, request(id))
	if crashAfter < 0 && err != nil || crashAfter >= 0 && !errors.Is(err, proptest.ErrCrashed) {
		t.Fatalf("%s: %v", id, err)
	}
	time.Sleep(2 * time.Millisecond) // the listing is newest first: no two runs start in one millisecond
}

// fixture: a finished run whose observation is an attack, a run with a
// never action in doubt, a run stopped by env_error, a corrupt run.
func fixture(t *testing.T) (*seamstest.MemStore, *httptest.Server) {
	store := &seamstest.MemStore{}
	runOn(t, store, "evil", -1, `TOOL read {}`, `FINAL: `+evil)
	runOn(t, store, "doubt", 4, `TOOL read {}`, `TOOL pay {}`, `FINAL: x`)
	runOn(t, store, "env", -1, `TOOL python {}`)
	failure := "x"
	if _, err := store.Append(context.Background(), "zcorrupt", ulid.ULID{},
		events.RunStarted{RunID: "zcorrupt", SchemaVersion: events.CurrentSchemaVersion},
		events.ModelCallResult{RunID: "zcorrupt", ResultID: "orphan", Failure: &failure}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(viewer.New(store, viewer.Options{}))
	t.Cleanup(srv.Close)
	return store, srv
}

func get(t *testing.T, url string) (int, http.Header, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// TestPagesEscapeEverythingARunHolds: a run whose tool output and answer
// are HTML renders them as text; no script from a run reaches a page, and
// the policy forbids inline script anyway.
func TestPagesEscapeEverythingARunHolds(t *testing.T) {
	_, srv := fixture(t)
	for _, path := range []string{"/", "/run?id=evil"} {
		code, hdr, body := get(t, srv.URL+path)
		if code != 200 {
			t.Fatalf("%s: %d %s", path, code, body)
		}
		if strings.Contains(body, "<script>alert") || strings.Contains(body, "<img src=x") {
			t.Fatalf("%s renders a run's HTML:\n%s", path, body)
		}
		if !strings.Contains(hdr.Get("Content-Security-Policy"), "script-src 'self'") {
			t.Fatalf("%s: CSP %q", path, hdr.Get("Content-Security-Policy"))
		}
	}
	_, _, body := get(t, srv.URL+"/run?id=evil")
	if !strings.Contains(body, "&lt;script&gt;alert(&#34;pwned&#34;)&lt;/script&gt;") {
		t.Fatalf("the observation is not shown escaped:\n%s", body)
	}
}

// TestTheRunsPage lists runs newest first with their status, and filters.
func TestTheRunsPage(t *testing.T) {
	_, srv := fixture(t)
	_, _, body := get(t, srv.URL+"/")
	for _, want := range []string{`href="run?id=evil"`, "status-in_doubt", "status-corrupt", ">env_error<", "agent_finished"} {
		if !strings.Contains(body, want) {
			t.Errorf("runs page lacks %q", want)
		}
	}
	if strings.Index(body, "run?id=zcorrupt") > strings.Index(body, "run?id=evil") {
		t.Error("runs are not newest first")
	}
	_, _, body = get(t, srv.URL+"/?status=in_doubt")
	if !strings.Contains(body, "run?id=doubt") || strings.Contains(body, "run?id=evil") {
		t.Errorf("status filter:\n%s", body)
	}
	if code, _, _ := get(t, srv.URL+"/?status=bogus"); code != 400 {
		t.Errorf("a bad filter: %d", code)
	}
}

// TestTheRunPage shows the timeline, the verdict, the side effect in doubt
// with what Resume would do, and env_error causes.
func TestTheRunPage(t *testing.T) {
	_, srv := fixture(t)
	_, _, body := get(t, srv.URL+"/run?id=doubt")
	for _, want := range []string{`id="in-doubt"`, "tool pay", "replay policy never", "finish with resume_state_unknown",
		`data-follow="api/follow?after=`, "&amp;run=doubt", "<progress"} {
		if !strings.Contains(body, want) {
			t.Errorf("run page lacks %q:\n%s", want, body)
		}
	}
	_, _, body = get(t, srv.URL+"/run?id=env")
	// The cause above the timeline, and again in its step's row.
	if !strings.Contains(body, `<p class="bad">env_error in step 0: exec: python: not found</p>`) || !strings.Contains(body, `<p class="bad">cause: exec: python: not found</p>`) || strings.Contains(body, "data-follow") {
		t.Errorf("env run page:\n%s", body)
	}
	_, _, body = get(t, srv.URL+"/run?id=zcorrupt")
	if !strings.Contains(body, "corrupt: Resume would refuse") || !strings.Contains(body, "without a model intent") {
		t.Errorf("corrupt run page:\n%s", body)
	}
	if code, _, _ := get(t, srv.URL+"/run?id=nope"); code != 404 {
		t.Errorf("unknown run: %d", code)
	}
	if code, _, _ := get(t, srv.URL+"/run"); code != 400 {
		t.Errorf("no run id: %d", code)
	}
}

// TestTheJSONEndpointsSpeakTheInspectorsNames: the shapes of
// polyloop-inspect --json.
func TestTheJSONEndpointsSpeakTheInspectorsNames(t *testing.T) {
	_, srv := fixture(t)
	var runs []report.RunJSON
	decode(t, srv.URL+"/api/runs?stop_reason=agent_finished", &runs)
	if len(runs) != 1 || runs[0].RunID != "evil" || runs[0].FinalAnswer == nil || *runs[0].FinalAnswer != evil {
		t.Fatalf("runs: %+v", runs)
	}
	var evs []map[string]any
	decode(t, srv.URL+"/api/events?run=evil", &evs)
	if len(evs) == 0 || evs[0]["kind"] != "run_started" || evs[0]["id"] == nil || evs[0]["payload"] == nil {
		t.Fatalf("events: %v", evs)
	}
	var steps []map[string]any
	decode(t, srv.URL+"/api/steps?run=evil", &steps)
	if len(steps) != 2 || len(steps[0]) != 18 {
		t.Fatalf("steps: %d rows, %d keys", len(steps), len(steps[0]))
	}
	var v report.VerdictJSON
	decode(t, srv.URL+"/api/verify?run=doubt", &v)
	if v.Verdict != "resumable" || v.InDoubt == nil || v.InDoubt.ReplayPolicy != events.ReplayNever {
		t.Fatalf("verify: %+v", v)
	}
	_, _, raw := get(t, srv.URL+"/api/events?run=evil")
	if strings.Contains(raw, "<script>") {
		t.Fatal("JSON carries raw HTML")
	}
}

func decode(t *testing.T, url string, v any) {
	t.Helper()
	code, hdr, body := get(t, url)
	if code != 200 || hdr.Get("Content-Type") != "application/json" {
		t.Fatalf("%s: %d %s", url, code, body)
	}
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
}

// TestTheViewerOnlyReads: any method but GET and HEAD is refused, and the
// store is never written.
func TestTheViewerOnlyReads(t *testing.T) {
	store, srv := fixture(t)
	before := store.Transactions()
	for _, m := range []string{"POST", "PUT", "DELETE", "PATCH"} {
		req, _ := http.NewRequest(m, srv.URL+"/api/runs", strings.NewReader("{}"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 405 {
			t.Errorf("%s: %d", m, resp.StatusCode)
		}
	}
	get(t, srv.URL+"/")
	get(t, srv.URL+"/run?id=doubt")
	if store.Transactions() != before {
		t.Fatal("the viewer wrote")
	}
	if code, _, body := get(t, srv.URL+"/static/live.js"); code != 200 || !strings.Contains(body, "EventSource") {
		t.Fatalf("live.js: %d", code)
	}
}

// TestFollowStreamsNewEvents: the follow endpoint sends a finished run's
// events after ?after= and ends with run_finished.
func TestFollowStreamsNewEvents(t *testing.T) {
	_, srv := fixture(t)
	code, hdr, body := get(t, srv.URL+"/api/follow?run=evil&after=2")
	if code != 200 || hdr.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("%d %q", code, hdr.Get("Content-Type"))
	}
	if strings.Count(body, "data: ") < 2 || !strings.Contains(body, "id: 3\n") || !strings.Contains(body, `"kind":"run_finished"`) {
		t.Fatalf("stream:\n%s", body)
	}
	if strings.Contains(body, "id: 1\n") {
		t.Fatal("events before ?after= were sent")
	}
}

// TestFollowIDsCountTheEventsSent: each server-sent event's id is the
// number of the run's events up to and including it — the ?after= a client
// reconnecting after it would send — so the ids run after+1, after+2, ... to
// the run's last event, each beside that event.
func TestFollowIDsCountTheEventsSent(t *testing.T) {
	store, srv := fixture(t)
	stream, err := store.Load(context.Background(), "evil")
	if err != nil {
		t.Fatal(err)
	}
	for _, after := range []int{0, 2} {
		_, _, body := get(t, fmt.Sprintf("%s/api/follow?run=evil&after=%d", srv.URL, after))
		if want := frames(t, stream, after); body != want {
			t.Errorf("after=%d: the stream sent\n%s\nwant\n%s", after, body, want)
		}
	}
}

// frames is what the follow endpoint sends for events stream[after:]: an
// id (the count of events up to and including it) and the event's JSON.
func frames(t *testing.T, stream []events.Envelope, after int) string {
	t.Helper()
	var b strings.Builder
	for i := after; i < len(stream); i++ {
		js, err := json.Marshal(report.Event(stream[i]))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "id: %d\ndata: %s\n\n", i+1, js)
	}
	return b.String()
}

// TestFollowWaitsAtTheEndOfARunInProgress: a run not finished is followed
// past its last event: the stream stays open, polling, until the client
// leaves — it neither ends nor fails once it has sent every event. Nobody
// holds the run (its driver crashed): the stream says so once, in a
// liveness event, and nothing more while nothing changes.
func TestFollowWaitsAtTheEndOfARunInProgress(t *testing.T) {
	store, _ := fixture(t)
	stream, err := store.Load(context.Background(), "doubt")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(viewer.New(store, viewer.Options{Poll: time.Millisecond}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := followAll(t, ctx, srv.URL, stream)
	defer resp.Body.Close()
	time.AfterFunc(1200*time.Millisecond, cancel) // hundreds of polls finding nothing new, and a liveness check
	rest, err := io.ReadAll(resp.Body)
	if !errors.Is(err, context.Canceled) || strings.Count(string(rest), "\n\n") != 1 || liveness(t, string(rest)) != seams.StatusInterrupted {
		t.Fatalf("after the last event the stream sent %q and ended with %v, want one liveness event (interrupted), then nothing until the client left", rest, err)
	}
}

// liveness is the status a follow stream's liveness event (the first of
// frames) gives, failing t when there is none.
func liveness(t *testing.T, frames string) seams.RunStatus {
	t.Helper()
	data, ok := strings.CutPrefix(strings.SplitN(frames, "\n\n", 2)[0], "event: liveness\ndata: ")
	var ev struct {
		RunID    string          `json:"run_id"`
		Status   seams.RunStatus `json:"status"`
		Liveness string          `json:"liveness"`
	}
	if !ok || json.Unmarshal([]byte(data), &ev) != nil || ev.Liveness == "" || ev.RunID == "" {
		t.Fatalf("no liveness event: %q", frames)
	}
	return ev.Status
}

// failingLoads serves Load from its store until fail is set, then fails;
// it counts the Loads.
type failingLoads struct {
	seams.RunReader
	fail  atomic.Bool
	loads atomic.Int32
}

func (f *failingLoads) Load(ctx context.Context, id string) ([]events.Envelope, error) {
	f.loads.Add(1)
	if f.fail.Load() {
		return nil, errors.New("the store went away")
	}
	return f.RunReader.Load(ctx, id)
}

// TestFollowReportsAStoreThatFailsAndEnds: when a Load fails while a run is
// followed, the stream sends an error event after the events it sent (and
// the liveness event that says nobody drives the run), and ends; it does
// not go on polling a store it cannot read.
func TestFollowReportsAStoreThatFailsAndEnds(t *testing.T) {
	store, _ := fixture(t)
	stream, err := store.Load(context.Background(), "doubt")
	if err != nil {
		t.Fatal(err)
	}
	failing := &failingLoads{RunReader: store}
	srv := httptest.NewServer(viewer.New(failing, viewer.Options{Poll: time.Millisecond}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp := followAll(t, ctx, srv.URL, stream)
	defer resp.Body.Close()
	failing.fail.Store(true)
	rest, err := io.ReadAll(resp.Body)
	if err != nil || liveness(t, string(rest)) != seams.StatusInterrupted {
		t.Fatalf("after the store failed the stream sent %q and ended with %v", rest, err)
	}
	_, rest, _ = bytes.Cut(rest, []byte("\n\n"))
	if !strings.HasPrefix(string(rest), "event: error\ndata: ") || !strings.HasSuffix(string(rest), "\n\n") || strings.Count(string(rest), "\n\n") != 1 {
		t.Fatalf("after the liveness event the stream sent %q, want one error event and the end", rest)
	}
}

// TestAHeadOfFollowDoesNotStream: HEAD of the follow endpoint answers its
// headers and returns at once, even for a run in progress, which a GET
// follows until the client leaves: one Load, and no polling after it.
func TestAHeadOfFollowDoesNotStream(t *testing.T) {
	store, _ := fixture(t)
	counting := &failingLoads{RunReader: store}
	srv := httptest.NewServer(viewer.New(counting, viewer.Options{Poll: time.Millisecond}))
	defer srv.Close()
	req, _ := http.NewRequest("HEAD", srv.URL+"/api/follow?run=doubt", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || err != nil || len(b) != 0 {
		t.Fatalf("HEAD: %d %q, body %q (%v)", resp.StatusCode, resp.Header.Get("Content-Type"), b, err)
	}
	time.Sleep(50 * time.Millisecond) // dozens of polls, were it polling
	if n := counting.loads.Load(); n != 1 {
		t.Fatalf("HEAD of follow loaded the run %d times, want once", n)
	}
}

// TestOddRunIDsAreFollowedToo: the page of a run whose id holds URL
// syntax follows that run, and the follow endpoint refuses a bad after.
func TestOddRunIDsAreFollowedToo(t *testing.T) {
	store, srv := fixture(t)
	const odd = "a+b&run=c#d%"
	if _, err := store.Append(context.Background(), odd, ulid.ULID{}, events.RunStarted{RunID: odd, SchemaVersion: events.CurrentSchemaVersion}); err != nil {
		t.Fatal(err)
	}
	_, _, runs := get(t, srv.URL+"/")
	link := regexp.MustCompile(`href="(run\?id=a[^"]*)"`).FindStringSubmatch(runs)
	if link == nil {
		t.Fatalf("no link to the odd run:\n%s", runs)
	}
	_, _, page := get(t, srv.URL+"/"+html.UnescapeString(link[1]))
	follow := regexp.MustCompile(`data-follow="([^"]*)"`).FindStringSubmatch(page)
	if follow == nil {
		t.Fatalf("the odd run's page does not follow:\n%s", page)
	}
	u, err := url.Parse(html.UnescapeString(follow[1]))
	if err != nil || u.Query().Get("run") != odd || u.Query().Get("after") != "1" {
		t.Fatalf("follow URL %q names run %q", follow[1], u.Query().Get("run"))
	}
	for _, bad := range []string{"-1", "x"} {
		if code, _, _ := get(t, srv.URL+"/api/follow?run=evil&after="+bad); code != 400 {
			t.Errorf("after=%s: %d", bad, code)
		}
	}
	if code, _, _ := get(t, srv.URL+"/api/follow?run=nope"); code != 404 {
		t.Errorf("follow of an unknown run: %d", code)
	}
}

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// TestRunIDsNoStoreCanKeepAreBadRequests: on every store alike, each page
// and endpoint that names a run answers an id no store can keep (a NUL
// byte, bytes that are not UTF-8, a control character) with 400 and a
// plain message saying what is wrong with the id — never a database's
// error, and never a 500.
func TestRunIDsNoStoreCanKeepAreBadRequests(t *testing.T) {
	kvStore, err := kv.Open(filepath.Join(t.TempDir(), "s.db"), kv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer kvStore.Close()
	pgStore, err := pgstore.Open(context.Background(), pgtest.StoreURL(t), pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pgStore.Close()
	for name, store := range map[string]seams.RunReader{"memory": &seamstest.MemStore{}, "kv": kvStore, "postgres": pgStore} {
		srv := httptest.NewServer(viewer.New(store, viewer.Options{}))
		for _, id := range []string{"%00", "a%00b", "%FF", "%1B%5B31m", "a%0Ab"} {
			for _, path := range []string{"api/verify?run=", "api/events?run=", "api/steps?run=", "api/follow?run=", "run?id="} {
				code, _, body := get(t, srv.URL+"/"+path+id)
				if code != http.StatusBadRequest || !strings.Contains(body, "invalid run id") ||
					strings.Contains(body, "SQLSTATE") || strings.Contains(body, "UTF8") {
					t.Errorf("%s: /%s%s: %d %q, want 400 saying the run id is invalid", name, path, id, code, body)
				}
			}
		}
		srv.Close()
	}
}

// TestFollowEndsWithAnErrorWhenTheRunIsReplaced: a run deleted and started
// again while it is followed ends the event stream with an error event
// saying so — never with the new run's events as if they continued the
// old one's.
func TestFollowEndsWithAnErrorWhenTheRunIsReplaced(t *testing.T) {
	stream := proptest.SoundStream("f")
	store := &seamstest.MemStore{}
	proptest.AppendEach(t, store, "f", stream[:3])
	srv := httptest.NewServer(viewer.New(store, viewer.Options{Poll: 5 * time.Millisecond}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/api/follow?run=f&after=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	var got []string
	for lines.Scan() {
		got = append(got, lines.Text())
		if lines.Text() == "id: 3" {
			if err := store.DeleteRun(context.Background(), "f", true); err != nil {
				t.Fatal(err)
			}
			proptest.AppendEach(t, store, "f", stream)
		}
	}
	body := strings.Join(got, "\n")
	if !strings.Contains(body, "id: 2\n") || strings.Contains(body, "id: 1\n") || strings.Contains(body, "id: 4\n") ||
		!strings.Contains(body, "event: error\ndata: ") || !strings.Contains(body, "no longer continues") {
		t.Fatalf("stream:\n%s\nwant events 2 and 3, then an error saying the run no longer continues", body)
	}
}

// followAll follows run "doubt" at url and reads the frames of every event
// of stream, failing t unless they are exactly those; the response is left
// open for what follows them.
func followAll(t *testing.T, ctx context.Context, url string, stream []events.Envelope) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"/api/follow?run=doubt", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	want := frames(t, stream, 0)
	got := make([]byte, len(want))
	if _, err := io.ReadFull(resp.Body, got); err != nil || string(got) != want {
		resp.Body.Close()
		t.Fatalf("the stream sent\n%s\n(%v), want\n%s", got, err, want)
	}
	return resp
}

// TestAFollowEndsWithTheServersBaseContext: a follow stream on a run in
// progress lasts until the client leaves, so http.Server.Shutdown waits
// for it; a server whose BaseContext is cancelled when it shuts down, as
// the package doc says to give it, ends the stream and shuts down.
func TestAFollowEndsWithTheServersBaseContext(t *testing.T) {
	store, _ := fixture(t)
	stream, err := store.Load(context.Background(), "doubt")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base, stop := context.WithCancel(context.Background())
	defer stop()
	srv := &http.Server{Handler: viewer.New(store, viewer.Options{Poll: time.Millisecond}),
		BaseContext: func(net.Listener) context.Context { return base }}
	go srv.Serve(ln)
	resp := followAll(t, context.Background(), "http://"+ln.Addr().String(), stream)
	defer resp.Body.Close()
	waiting, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := srv.Shutdown(waiting); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown with a follow stream open: %v, want it to wait for the stream", err)
	}
	stop()
	done, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	if err := srv.Shutdown(done); err != nil {
		t.Fatalf("Shutdown once the base context ended: %v", err)
	}
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Fatalf("the stream did not end cleanly: %v", err)
	}
}
