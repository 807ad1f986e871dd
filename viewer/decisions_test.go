package viewer_test

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
	"github.com/polyloop/polyloop/viewer"
)

// definition is the fixtures' definition over store, the model answering
// turns.
func definition(store seams.RunStore, turns ...string) engine.Definition {
	return engine.Definition{Model: &seamstest.Model{Turns: seamstest.Replies(turns...)}, Parser: seamstest.Parser{}, Store: store}
}

// awaiting is the call run id of store waits for, after err (Run's or
// Resume's) said it waits for a person.
func awaiting(t *testing.T, id string, err error) recovery.PendingCall {
	t.Helper()
	var aw *engine.AwaitingError
	if !errors.As(err, &aw) || len(aw.Calls) != 1 {
		t.Fatalf("%s: %v, want it awaiting one decision", id, err)
	}
	time.Sleep(2 * time.Millisecond) // the listing is newest first: no two runs start in one millisecond
	return aw.Calls[0]
}

// awaitApproval runs id until its refund of amount waits for approval.
func awaitApproval(t *testing.T, store seams.RunStore, id, args string) recovery.PendingCall {
	t.Helper()
	_, err := engine.Run(context.Background(), definition(store, `TOOL refund `+args), request(id))
	return awaiting(t, id, err)
}

// resolutionRequest is request(id) that awaits an operator's finding on
// an action left in doubt.
func resolutionRequest(id string) engine.Request {
	req := request(id)
	req.AwaitResolution = true
	return req
}

// awaitResolution runs id until a crash leaves its pay call in doubt, then
// resumes it: it waits for an operator's finding.
func awaitResolution(t *testing.T, store seams.RunStore, id string) recovery.PendingCall {
	t.Helper()
	_, err := engine.Run(context.Background(), definition(&proptest.CrashingStore{Inner: store, After: 2}, `TOOL pay {"to":"x"}`),
		resolutionRequest(id))
	if !errors.Is(err, proptest.ErrCrashed) {
		t.Fatalf("%s: %v, want it crashed", id, err)
	}
	_, err = engine.Resume(context.Background(), definition(store), resolutionRequest(id))
	return awaiting(t, id, err)
}

// TestAPendingCallIsShownAtTheTopOfItsRun: the page of a run awaiting
// approval, or a resolution, shows the call above everything else — what
// it waits for, the tool, its arguments as indented JSON, the call's id,
// since when — and says nobody drives the run until a person decides; its
// verdict JSON carries the call; the listings filter on both statuses. A
// viewer mounted without a writer offers no buttons.
func TestAPendingCallIsShownAtTheTopOfItsRun(t *testing.T) {
	store, srv := fixture(t)
	calls := map[string]recovery.PendingCall{
		"wait":   awaitApproval(t, store, "wait", `{"amount":40,"to":"<b>x</b>"}`),
		"unsure": awaitResolution(t, store, "unsure"),
	}
	for _, c := range []struct {
		run    string
		status seams.RunStatus
		awaits events.Awaits
		tool   string
		args   string // as the page shows them
	}{
		{"wait", seams.StatusAwaitingApproval, events.AwaitsApproval, "refund", "{\n  &#34;amount&#34;: 40,\n  &#34;to&#34;: &#34;\\u003cb\\u003ex\\u003c/b\\u003e&#34;\n}"},
		{"unsure", seams.StatusAwaitingResolution, events.AwaitsResolution, "pay", "{\n  &#34;to&#34;: &#34;x&#34;\n}"},
	} {
		call := calls[c.run]
		if call.Awaits != c.awaits || call.Tool != c.tool {
			t.Fatalf("%s: the engine says it awaits %+v", c.run, call)
		}
		_, _, page := get(t, srv.URL+"/run?id="+c.run)
		pending := strings.Index(page, `<section id="pending"`)
		if pending < 0 || pending > strings.Index(page, `id="verify"`) || pending > strings.Index(page, `id="steps"`) {
			t.Errorf("%s: the pending call is not at the top of the page:\n%s", c.run, page)
		}
		for _, want := range []string{`<b id="status">` + string(c.status) + `</b>`,
			`<h2>awaiting ` + string(c.awaits) + `</h2>`, `tool <b id="pending-tool">` + c.tool + `</b>`,
			`call <code id="pending-call">` + call.Call + `</code>`, `<pre id="pending-arguments">` + c.args + `</pre>`,
			"since " + seamsStamp(call.Since), "step 0",
			`<p id="liveness" class="liveness-person"><b>waits for a person</b>: nobody drives it until a decision is recorded`,
			"in step 0: wait for a person&#39;s decision, write nothing"} {
			if !strings.Contains(page, want) {
				t.Errorf("%s: the page lacks %q:\n%s", c.run, want, page)
			}
		}
		for _, never := range []string{`method="post"`, "<button", "resumable in step"} {
			if strings.Contains(page, never) {
				t.Errorf("%s: a read-only viewer's page shows %q:\n%s", c.run, never, page)
			}
		}
		var v struct {
			Verdict string                `json:"verdict"`
			Pending *recovery.PendingCall `json:"pending"`
		}
		decode(t, srv.URL+"/api/verify?run="+c.run, &v)
		if v.Verdict != string(c.status) || v.Pending == nil || v.Pending.Call != call.Call || v.Pending.Awaits != c.awaits ||
			v.Pending.Tool != c.tool || v.Pending.Arguments != call.Arguments || !v.Pending.Since.Equal(call.Since) {
			t.Errorf("%s: verify JSON %+v, pending %+v, want %+v", c.run, v, v.Pending, call)
		}
		_, _, runs := get(t, srv.URL+"/?status="+string(c.status))
		if got := regexp.MustCompile(`href="run\?id=([^"]*)"`).FindAllStringSubmatch(runs, -1); len(got) != 1 || got[0][1] != c.run {
			t.Errorf("?status=%s lists %q, want %s alone", c.status, got, c.run)
		}
		var listed []struct {
			RunID  string          `json:"run_id"`
			Status seams.RunStatus `json:"status"`
		}
		decode(t, srv.URL+"/api/runs?status="+string(c.status), &listed)
		if len(listed) != 1 || listed[0].RunID != c.run || listed[0].Status != c.status {
			t.Errorf("/api/runs?status=%s: %+v", c.status, listed)
		}
	}
	var v struct {
		Pending *recovery.PendingCall `json:"pending"`
	}
	decode(t, srv.URL+"/api/verify?run=doubt", &v)
	if v.Pending != nil {
		t.Errorf("a run awaiting nobody has a pending call in its JSON: %+v", v.Pending)
	}
	if _, _, page := get(t, srv.URL+"/run?id=doubt"); strings.Contains(page, `id="pending"`) {
		t.Errorf("a run awaiting nobody shows a pending call:\n%s", page)
	}
}

func seamsStamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// decisionJSON is a decision as /api/decisions gives it.
type decisionJSON struct {
	ID          string         `json:"id"`
	Time        string         `json:"time"`
	Step        int            `json:"step"`
	Call        string         `json:"call"`
	Verdict     events.Verdict `json:"verdict"`
	By          string         `json:"by"`
	Note        string         `json:"note"`
	Arguments   *string        `json:"arguments"`
	Observation *string        `json:"observation"`
}

// TestDecisionsAppearInTheTimeline: each decision — an approval with
// edited arguments, a rejection, an operator's finding — is a row of the
// step timeline saying who decided what, when, with the note, the edited
// arguments and the observation; beside the step in progress until the
// step completes, then below that step's row. /api/decisions lists them
// with their step, /api/events has them as events, and the steps JSON
// keeps its eighteen fields.
func TestDecisionsAppearInTheTimeline(t *testing.T) {
	store, srv := fixture(t)
	ctx := context.Background()
	edited := `{"amount":30}`
	seen := "the ledger shows <i>one</i> payment"
	decide := map[string]events.Decision{
		"approved": {Verdict: events.VerdictApproved, By: "ana", Note: "capped at 30", Arguments: &edited},
		"rejected": {Verdict: events.VerdictRejected, By: "bo", Note: "too much"},
		"resolved": {Verdict: events.VerdictExecuted, By: "ops", Observation: &seen},
	}
	for _, c := range []struct {
		run    string
		want   []string // in the decision's row
		status events.ActionStatus
	}{
		{"approved", []string{"<b>approved</b> by <b>ana</b>", "note: <q>capped at 30</q>", "edited arguments: <pre>{\n  &#34;amount&#34;: 30\n}</pre>"}, events.StatusExecuted},
		{"rejected", []string{"<b>rejected</b> by <b>bo</b>", "note: <q>too much</q>"}, events.StatusNotExecuted},
		{"resolved", []string{"<b>executed</b> by <b>ops</b>", "observation: <pre>the ledger shows &lt;i&gt;one&lt;/i&gt; payment</pre>"}, events.StatusExecuted},
	} {
		var call recovery.PendingCall
		req := request(c.run)
		if c.run == "resolved" {
			call, req = awaitResolution(t, store, c.run), resolutionRequest(c.run)
		} else {
			call = awaitApproval(t, store, c.run, `{"amount":40}`)
		}
		d := decide[c.run]
		d.RunID, d.ResultID = c.run, call.Call
		decided := engine.Decide
		if d.Verdict.Resolves() {
			decided = engine.Resolve
		}
		env, err := decided(ctx, store, d)
		if err != nil {
			t.Fatal(err)
		}
		row := func(page string) (string, int) {
			m := regexp.MustCompile(`(?s)<tr class="decision verdict-[a-z_]+" id="decision-` + env.ID.String() + `">.*?</tr>`).FindStringIndex(page)
			if m == nil {
				t.Fatalf("%s: no row for the decision:\n%s", c.run, page)
			}
			return page[m[0]:m[1]], m[0]
		}
		check := func(when string, page string) {
			r, _ := row(page)
			for _, want := range append(c.want, "<td>0</td>", "at "+seamsStamp(env.Time()), "call <code>"+call.Call+"</code>") {
				if !strings.Contains(r, want) {
					t.Errorf("%s %s: the decision's row lacks %q:\n%s", c.run, when, want, r)
				}
			}
		}
		_, _, page := get(t, srv.URL+"/run?id="+c.run)
		check("before the step completes", page)
		if strings.Contains(page, `id="pending"`) || strings.Contains(page, `class="step`) {
			t.Errorf("%s: decided, before the step completes, the page shows a pending call or a completed step:\n%s", c.run, page)
		}

		if _, err := engine.Resume(ctx, definition(store, `FINAL: done`), req); err != nil {
			t.Fatalf("%s: resume: %v", c.run, err)
		}
		_, _, page = get(t, srv.URL+"/run?id="+c.run)
		check("once the step completed", page)
		if _, at := row(page); at < strings.Index(page, `<tr class="step`) {
			t.Errorf("%s: the decision's row comes before its step's:\n%s", c.run, page)
		}
		if !strings.Contains(page, "<td>"+string(c.status)+"</td>") || !strings.Contains(page, `<b id="status">finished</b>`) {
			t.Errorf("%s: the step is not %s, or the run not finished:\n%s", c.run, c.status, page)
		}

		var ds []decisionJSON
		decode(t, srv.URL+"/api/decisions?run="+c.run, &ds)
		if len(ds) != 1 || ds[0].ID != env.ID.String() || ds[0].Time != seamsStamp(env.Time()) || ds[0].Step != 0 || ds[0].Call != call.Call ||
			ds[0].Verdict != d.Verdict || ds[0].By != d.By || ds[0].Note != d.Note || !samePtr(ds[0].Arguments, d.Arguments) || !samePtr(ds[0].Observation, d.Observation) {
			t.Errorf("%s: /api/decisions %+v, want %+v", c.run, ds, d)
		}
		var evs []struct {
			Kind    events.Kind     `json:"kind"`
			Payload events.Decision `json:"payload"`
		}
		decode(t, srv.URL+"/api/events?run="+c.run, &evs)
		var found bool
		for _, e := range evs {
			found = found || e.Kind == events.KindDecision && e.Payload.By == d.By && e.Payload.Verdict == d.Verdict
		}
		if !found {
			t.Errorf("%s: /api/events lacks the decision: %+v", c.run, evs)
		}
		var steps []map[string]any
		decode(t, srv.URL+"/api/steps?run="+c.run, &steps)
		if len(steps) != 2 || len(steps[0]) != 18 {
			t.Errorf("%s: steps JSON: %d rows, %d keys", c.run, len(steps), len(steps[0]))
		}
	}
	var none []decisionJSON
	decode(t, srv.URL+"/api/decisions?run=evil", &none)
	if none == nil || len(none) != 0 {
		t.Errorf("a run without decisions: %v, want []", none)
	}
	if code, _, _ := get(t, srv.URL+"/api/decisions?run=nope"); code != http.StatusNotFound {
		t.Errorf("/api/decisions of no run: %d", code)
	}
}

func samePtr(a, b *string) bool { return a == nil && b == nil || a != nil && b != nil && *a == *b }

// TestFollowSendsADecisionAsItIsRecorded: a client following a run that
// awaits approval is sent the decision when a person records it — the
// event that makes a run's page reload and show it.
func TestFollowSendsADecisionAsItIsRecorded(t *testing.T) {
	store := &seamstest.MemStore{}
	call := awaitApproval(t, store, "wait", `{"amount":40}`)
	srv := httptest.NewServer(viewer.New(store, viewer.Options{Poll: time.Millisecond}))
	defer srv.Close()
	stream, err := store.Load(context.Background(), "wait")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/api/follow?run=wait&live=interrupted&after="+strconv.Itoa(len(stream)), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := engine.Decide(context.Background(), store, events.Decision{RunID: "wait", ResultID: call.Call, Verdict: events.VerdictApproved, By: "ana"}); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		if data, ok := strings.CutPrefix(lines.Text(), "data: "); ok && strings.Contains(data, `"kind":"decision"`) {
			if !strings.Contains(data, `"by":"ana"`) || !strings.Contains(data, `"verdict":"approved"`) {
				t.Fatalf("the decision as sent: %s", data)
			}
			return
		} else if ok && !strings.Contains(data, `"liveness"`) {
			t.Fatalf("the stream sent %s before the decision", data)
		}
	}
	t.Fatalf("the stream ended (%v) without the decision", lines.Err())
}
