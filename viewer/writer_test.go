package viewer_test

import (
	"context"
	"encoding/json"
	"errors"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
	"github.com/polyloop/polyloop/viewer"
)

// writerOptions mount the viewer as a writer over store, as a service
// would: engine.Decide and engine.Resolve routed by the verdict (their
// refusals answered by viewer.DecisionStatus), decisions recorded as
// "ana".
func writerOptions(store seams.RunStore) viewer.Options {
	return viewer.Options{
		Decide: func(ctx context.Context, d events.Decision) (events.Envelope, error) {
			if d.Verdict.Resolves() {
				return engine.Resolve(ctx, store, d)
			}
			return engine.Decide(ctx, store, d)
		},
		Reviewer: "ana",
	}
}

// writerFixture is fixture's store with a run awaiting approval ("wait")
// and one awaiting a resolution ("unsure"), served by a viewer mounted as
// a writer.
func writerFixture(t *testing.T) (*seamstest.MemStore, *httptest.Server, map[string]recovery.PendingCall) {
	store, _ := fixture(t)
	calls := map[string]recovery.PendingCall{
		"wait":   awaitApproval(t, store, "wait", `{"amount":40}`),
		"unsure": awaitResolution(t, store, "unsure"),
	}
	srv := httptest.NewServer(viewer.New(store, writerOptions(store)))
	t.Cleanup(srv.Close)
	return store, srv, calls
}

// noRedirects is a client that shows a redirect rather than following it.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// post posts form to url with headers, answering the status, the
// Location and the body.
func post(t *testing.T, url string, form url.Values, headers ...string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := noRedirects.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Location"), string(b)
}

// forms are the decision forms of a page: each form's id and its fields'
// values (a button's as verdict).
func forms(t *testing.T, page string) map[string]url.Values {
	t.Helper()
	out := map[string]url.Values{}
	for _, f := range regexp.MustCompile(`(?s)<form method="post" action="decide" id="([a-z-]+)">(.*?)</form>`).FindAllStringSubmatch(page, -1) {
		v := url.Values{}
		for _, in := range regexp.MustCompile(`<input type="hidden" name="([a-z]+)" value="([^"]*)">`).FindAllStringSubmatch(f[2], -1) {
			v.Set(in[1], html.UnescapeString(in[2]))
		}
		for _, b := range regexp.MustCompile(`<button name="verdict" value="([a-z_]+)"`).FindAllStringSubmatch(f[2], -1) {
			v.Add("verdict", b[1])
		}
		out[f[1]] = v
	}
	return out
}

// TestOnlyAWriterOffersDecisions: a viewer mounted with Decide offers
// approve and reject for a call awaiting approval, and resolve (executed,
// not executed) for an action awaiting a resolution or left in doubt on a
// run nobody drives — each form carrying the handler's token, the run and
// the call; no buttons for a finished run, or one a driver holds. Without
// Decide no page has a button, and a POST is refused 405, writing
// nothing.
func TestOnlyAWriterOffersDecisions(t *testing.T) {
	store, srv, calls := writerFixture(t)
	doubt, err := store.Load(context.Background(), "doubt")
	if err != nil {
		t.Fatal(err)
	}
	inDoubt := doubt[len(doubt)-1].Event.(events.Intent).ResultID
	var token string
	for _, c := range []struct {
		run   string
		call  string
		forms map[string]string // form id → its button's verdict
	}{
		{"wait", calls["wait"].Call, map[string]string{"approve": "approved", "reject": "rejected"}},
		{"unsure", calls["unsure"].Call, map[string]string{"resolve-executed": "executed", "resolve-not-executed": "not_executed"}},
		{"doubt", inDoubt, map[string]string{"resolve-executed": "executed", "resolve-not-executed": "not_executed"}},
		{"evil", "", nil},
		{"zcorrupt", "", nil},
	} {
		_, _, page := get(t, srv.URL+"/run?id="+c.run)
		got := forms(t, page)
		if len(got) != len(c.forms) {
			t.Errorf("%s: forms %v, want %v", c.run, got, c.forms)
			continue
		}
		for id, verdict := range c.forms {
			f := got[id]
			if f.Get("verdict") != verdict || f.Get("run") != c.run || f.Get("call") != c.call || len(f.Get("token")) < 20 {
				t.Errorf("%s: form %s holds %v, want verdict %s, run %s, call %s and a token", c.run, id, f, verdict, c.run, c.call)
			}
			if token == "" {
				token = f.Get("token")
			}
			if f.Get("token") != token {
				t.Errorf("%s: form %s has token %q, another form %q: want the handler's one token", c.run, id, f.Get("token"), token)
			}
		}
	}
	_, _, page := get(t, srv.URL+"/run?id=wait")
	for _, want := range []string{`<textarea name="arguments"`, `<input name="note"`} {
		if !strings.Contains(page, want) {
			t.Errorf("the approve form lacks %q:\n%s", want, page)
		}
	}
	_, _, page = get(t, srv.URL+"/run?id=unsure")
	if !strings.Contains(page, `<textarea name="observation"`) {
		t.Errorf("the resolve form lacks an observation:\n%s", page)
	}

	release, err := store.LockRun("wait") // a driver holds it (between writing the call and returning)
	if err != nil {
		t.Fatal(err)
	}
	_, _, page = get(t, srv.URL+"/run?id=wait")
	release()
	if f := forms(t, page); len(f) != 0 || !strings.Contains(page, `id="pending"`) {
		t.Errorf("a run a driver holds: forms %v (want none), the pending call shown: %t", f, strings.Contains(page, `id="pending"`))
	}

	readOnly := httptest.NewServer(viewer.New(store, viewer.Options{}))
	defer readOnly.Close()
	for _, run := range []string{"wait", "unsure", "doubt"} {
		_, _, page := get(t, readOnly.URL+"/run?id="+run)
		if strings.Contains(page, "<form method=\"post\"") || strings.Contains(page, "<button") || strings.Contains(page, token) {
			t.Errorf("%s: a read-only viewer's page offers a decision:\n%s", run, page)
		}
	}
	before := store.Transactions()
	form := url.Values{"token": {token}, "run": {"wait"}, "call": {calls["wait"].Call}, "verdict": {"approved"}}
	for _, path := range []string{"/decide", "/api/decide"} {
		if code, _, body := post(t, readOnly.URL+path, form); code != http.StatusMethodNotAllowed {
			t.Errorf("POST %s to a read-only viewer: %d %s", path, code, body)
		}
	}
	var v map[string]any
	decode(t, readOnly.URL+"/api/verify?run=wait", &v)
	if _, ok := v["decide_token"]; ok {
		t.Errorf("a read-only viewer's verdict JSON carries a token: %v", v)
	}
	if store.Transactions() != before {
		t.Fatal("a read-only viewer wrote")
	}
}

// TestAWriterRecordsEachDecision: each form, posted with the page's token,
// records its decision by the reviewer the viewer was mounted with — an
// approval with its note and edited arguments, a rejection, a finding of
// executed with its observation, one of not executed — and sends the
// browser back to the run's page (303), which shows it.
func TestAWriterRecordsEachDecision(t *testing.T) {
	for _, c := range []struct {
		run, form string
		fields    url.Values
		want      events.Decision
	}{
		{"wait", "approve", url.Values{"note": {"capped"}, "arguments": {`{"amount": 30}`}},
			events.Decision{Verdict: events.VerdictApproved, Note: "capped", Arguments: ptr(`{"amount":30}`)}}, // recorded as it runs
		{"wait", "approve", url.Values{"note": {""}, "arguments": {" \n"}}, events.Decision{Verdict: events.VerdictApproved}},
		{"wait", "reject", url.Values{"note": {"too much"}}, events.Decision{Verdict: events.VerdictRejected, Note: "too much"}},
		{"unsure", "resolve-executed", url.Values{"observation": {"paid once"}, "note": {"checked the ledger"}},
			events.Decision{Verdict: events.VerdictExecuted, Note: "checked the ledger", Observation: ptr("paid once")}},
		{"unsure", "resolve-executed", url.Values{"observation": {""}}, events.Decision{Verdict: events.VerdictExecuted}},
		{"unsure", "resolve-not-executed", url.Values{"note": {"no trace"}}, events.Decision{Verdict: events.VerdictNotExecuted, Note: "no trace"}},
	} {
		t.Run(c.form, func(t *testing.T) {
			store, srv, calls := writerFixture(t)
			_, _, page := get(t, srv.URL+"/run?id="+c.run)
			form := forms(t, page)[c.form]
			for k, v := range c.fields {
				form[k] = v
			}
			code, location, body := post(t, srv.URL+"/decide", form)
			if code != http.StatusSeeOther || location != "run?id="+c.run {
				t.Fatalf("POST: %d, Location %q: %s", code, location, body)
			}
			stream, err := store.Load(context.Background(), c.run)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := stream[len(stream)-1].Event.(events.Decision)
			want := c.want
			want.RunID, want.ResultID, want.By = c.run, calls[c.run].Call, "ana"
			if !ok || got.RunID != want.RunID || got.ResultID != want.ResultID || got.Verdict != want.Verdict || got.By != want.By ||
				got.Note != want.Note || !samePtr(got.Arguments, want.Arguments) || !samePtr(got.Observation, want.Observation) {
				t.Fatalf("the log's last event is %#v, want %#v", stream[len(stream)-1].Event, want)
			}
			_, _, page = get(t, srv.URL+"/"+location)
			if !strings.Contains(page, "decision: <b>"+string(want.Verdict)+"</b> by <b>ana</b>") || len(forms(t, page)) != 0 {
				t.Errorf("the run's page after the decision:\n%s", page)
			}
		})
	}
}

func ptr(s string) *string { return &s }

// TestDecisionsWithoutTheTokenOrFromAnotherSiteAreRefused: a POST without
// the handler's token, with another one, or sent by a browser from
// another origin (Sec-Fetch-Site, or an Origin that is not the viewer's)
// is refused 403 and writes nothing — on the form endpoint and the JSON
// one alike.
func TestDecisionsWithoutTheTokenOrFromAnotherSiteAreRefused(t *testing.T) {
	store, srv, calls := writerFixture(t)
	_, _, page := get(t, srv.URL+"/run?id=wait")
	good := forms(t, page)["approve"]
	with := func(k, v string) url.Values {
		f := url.Values{}
		for key, vs := range good {
			f[key] = vs
		}
		if v == "" {
			f.Del(k)
		} else {
			f.Set(k, v)
		}
		return f
	}
	other := httptest.NewServer(viewer.New(store, writerOptions(store))) // another handler: another token
	defer other.Close()
	_, _, otherPage := get(t, other.URL+"/run?id=wait")
	otherToken := forms(t, otherPage)["approve"].Get("token")
	if otherToken == "" || otherToken == good.Get("token") {
		t.Fatalf("two handlers' tokens: %q and %q", good.Get("token"), otherToken)
	}
	before := store.Transactions()
	for _, c := range []struct {
		name    string
		form    url.Values
		headers []string
	}{
		{"no token", with("token", ""), nil},
		{"a wrong token", with("token", good.Get("token")[1:]+"x"), nil},
		{"another handler's token", with("token", otherToken), nil},
		{"cross-site (Sec-Fetch-Site)", good, []string{"Sec-Fetch-Site", "cross-site"}},
		{"same-site but another origin (Sec-Fetch-Site)", good, []string{"Sec-Fetch-Site", "same-site"}},
		{"another Origin", good, []string{"Origin", "http://evil.example"}},
	} {
		code, _, body := post(t, srv.URL+"/decide", c.form, c.headers...)
		if code != http.StatusForbidden {
			t.Errorf("form, %s: %d %s, want 403", c.name, code, body)
		}
		js, _ := json.Marshal(map[string]any{"token": c.form.Get("token"), "run_id": "wait", "call": calls["wait"].Call, "verdict": "approved"})
		code, body = postJSON(t, srv.URL+"/api/decide", string(js), c.headers...)
		if code != http.StatusForbidden {
			t.Errorf("JSON, %s: %d %s, want 403", c.name, code, body)
		}
	}
	if store.Transactions() != before {
		t.Fatal("a refused decision wrote")
	}
	if code, _, body := post(t, srv.URL+"/decide", good, "Sec-Fetch-Site", "same-origin", "Origin", srv.URL); code != http.StatusSeeOther {
		t.Fatalf("the page's own form, as a browser sends it: %d %s", code, body)
	}
}

// postJSON posts body as JSON to url with headers, answering the status
// and the body.
func postJSON(t *testing.T, url, body string, headers ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestARefusedDecisionSaysWhy: a decision the engine refuses comes back
// with its status — 400 invalid, 404 no such run or call, 409 not pending
// or already decided — and the engine's reason: on the run's page (the
// form's entries kept), and as {"error": ...} from /api/decide. Nothing is
// written.
func TestARefusedDecisionSaysWhy(t *testing.T) {
	store, srv, calls := writerFixture(t)
	_, _, page := get(t, srv.URL+"/run?id=wait")
	token := forms(t, page)["approve"].Get("token")
	decided := awaitApproval(t, store, "decided", `{"amount":40}`)
	if _, err := engine.Decide(context.Background(), store, events.Decision{RunID: "decided", ResultID: decided.Call, Verdict: events.VerdictRejected, By: "bo"}); err != nil {
		t.Fatal(err)
	}
	before := store.Transactions()
	for _, c := range []struct {
		name      string
		form      url.Values
		code      int
		says      string // the reason, as the page and the JSON give it
		kept      string // an entry the page keeps, as it shows it
		pageCode  int    // the page's status when not code (no page for the run)
		plainText bool
	}{
		{"edited arguments the schema refuses", url.Values{"run": {"wait"}, "call": {calls["wait"].Call}, "verdict": {"approved"}, "arguments": {`{"amount": 900}`}, "note": {"ok?"}},
			400, "edited arguments", "{&#34;amount&#34;: 900}", 0, false},
		{"arguments that are no object", url.Values{"run": {"wait"}, "call": {calls["wait"].Call}, "verdict": {"approved"}, "arguments": {`[1]`}},
			400, "not a JSON object", "[1]", 0, false},
		{"a verdict that is none", url.Values{"run": {"wait"}, "call": {calls["wait"].Call}, "verdict": {"maybe"}},
			400, `verdict &#34;maybe&#34;`, "", 0, false},
		{"an approval of a call in doubt", url.Values{"run": {"unsure"}, "call": {calls["unsure"].Call}, "verdict": {"approved"}},
			409, "does not await this decision", "", 0, false},
		{"a finding on a call awaiting approval", url.Values{"run": {"wait"}, "call": {calls["wait"].Call}, "verdict": {"executed"}, "observation": {"seen"}},
			409, "does not await this decision", "", 0, false},
		{"a call already decided", url.Values{"run": {"decided"}, "call": {decided.Call}, "verdict": {"approved"}},
			409, "already decided: rejected by &#34;bo&#34;", "", 0, false},
		{"a call not in the run", url.Values{"run": {"wait"}, "call": {"nope"}, "verdict": {"approved"}},
			404, "no such call", "", 0, false},
		{"a run not in the store", url.Values{"run": {"nope"}, "call": {"x"}, "verdict": {"approved"}},
			404, "no such run", "", 404, true},
		{"an invalid run id", url.Values{"run": {"a\x00b"}, "call": {"x"}, "verdict": {"approved"}},
			400, "invalid run id", "", 400, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.form.Set("token", token)
			code, _, body := post(t, srv.URL+"/decide", c.form)
			if c.plainText {
				body = html.EscapeString(body)
			}
			if code != c.code || !strings.Contains(body, c.says) || !strings.Contains(body, c.kept) {
				t.Errorf("form: %d, want %d saying %q and keeping %q:\n%s", code, c.code, c.says, c.kept, body)
			}
			if !c.plainText && !strings.Contains(body, `<p class="bad" id="refused">`) {
				t.Errorf("form: the page does not show the refusal:\n%s", body)
			}
			req := map[string]any{"token": token, "run_id": c.form.Get("run"), "call": c.form.Get("call"), "verdict": c.form.Get("verdict"), "note": c.form.Get("note")}
			if a := c.form.Get("arguments"); a != "" {
				req["arguments"] = json.RawMessage(a)
			}
			if o := c.form.Get("observation"); o != "" {
				req["observation"] = o
			}
			js, _ := json.Marshal(req)
			code, body = postJSON(t, srv.URL+"/api/decide", string(js))
			var answer struct {
				Error string `json:"error"`
			}
			if err := json.Unmarshal([]byte(body), &answer); err != nil || code != c.code || !strings.Contains(html.EscapeString(answer.Error), c.says) {
				t.Errorf("JSON: %d %s, want %d and an error saying %q", code, body, c.code, c.says)
			}
		})
	}
	if store.Transactions() != before {
		t.Fatal("a refused decision wrote")
	}
}

// TestTheJSONEndpointRecordsADecision: /api/decide takes a decision as
// JSON with the token the run's JSON gives, answers the decision's event,
// and refuses what is not a decision request (400).
func TestTheJSONEndpointRecordsADecision(t *testing.T) {
	store, srv, calls := writerFixture(t)
	var v struct {
		Token   string                `json:"decide_token"`
		Pending *recovery.PendingCall `json:"pending"`
	}
	decode(t, srv.URL+"/api/verify?run=wait", &v)
	if v.Token == "" || v.Pending == nil {
		t.Fatalf("the run's JSON: %+v", v)
	}
	before := store.Transactions()
	for _, bad := range []string{``, `[]`, `{"token":` + jsonQuote(v.Token) + `,"run_id":"wait","bogus":1}`,
		`{"token":` + jsonQuote(v.Token) + `,"run_id":"wait","call":"` + v.Pending.Call + `","verdict":"approved","arguments":"{}"}`} {
		if code, body := postJSON(t, srv.URL+"/api/decide", bad); code != http.StatusBadRequest || !strings.Contains(body, `"error"`) {
			t.Errorf("%s: %d %s, want 400", bad, code, body)
		}
	}
	if store.Transactions() != before {
		t.Fatal("a bad request wrote")
	}
	code, body := postJSON(t, srv.URL+"/api/decide", `{"token":`+jsonQuote(v.Token)+`,"run_id":"wait","call":"`+v.Pending.Call+
		`","verdict":"approved","note":"fine","arguments":{"amount":25}}`)
	var ev struct {
		ID      string          `json:"id"`
		Kind    events.Kind     `json:"kind"`
		Payload events.Decision `json:"payload"`
	}
	if err := json.Unmarshal([]byte(body), &ev); code != http.StatusOK || err != nil || ev.Kind != events.KindDecision ||
		ev.Payload.By != "ana" || ev.Payload.Note != "fine" || ev.Payload.Arguments == nil || *ev.Payload.Arguments != `{"amount":25}` || ev.Payload.ResultID != calls["wait"].Call {
		t.Fatalf("%d %s", code, body)
	}
	stream, _ := store.Load(context.Background(), "wait")
	if last := stream[len(stream)-1]; last.ID.String() != ev.ID {
		t.Fatalf("the answer is event %s, the log ends with %s", ev.ID, last.ID)
	}
}

func jsonQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestWhoDecidesComesFromTheRequest: Options.By names the person from the
// request (here a header a proxy set); when it refuses the request, the
// decision is refused 403 and nothing is written. Without By, a writer
// mounted without a Reviewer records nothing and says what is missing.
func TestWhoDecidesComesFromTheRequest(t *testing.T) {
	store, _, calls := writerFixture(t)
	o := writerOptions(store)
	o.Reviewer = ""
	o.By = func(r *http.Request) (string, error) {
		if u := r.Header.Get("X-Forwarded-User"); u != "" {
			return u, nil
		}
		return "", errors.New("no X-Forwarded-User: sign in first")
	}
	srv := httptest.NewServer(viewer.New(store, o))
	defer srv.Close()
	_, _, page := get(t, srv.URL+"/run?id=wait")
	form := forms(t, page)["approve"]
	before := store.Transactions()
	if code, _, body := post(t, srv.URL+"/decide", form); code != http.StatusForbidden || !strings.Contains(body, "sign in first") {
		t.Errorf("nobody named: %d %s", code, body)
	}
	o.By = nil
	unnamed := httptest.NewServer(viewer.New(store, o))
	defer unnamed.Close()
	_, _, page = get(t, unnamed.URL+"/run?id=wait")
	if code, _, body := post(t, unnamed.URL+"/decide", forms(t, page)["approve"]); code != http.StatusInternalServerError ||
		!strings.Contains(body, "Options.Reviewer") {
		t.Errorf("a writer mounted without a name: %d %s", code, body)
	}
	if store.Transactions() != before {
		t.Fatal("a decision by nobody was written")
	}
	if code, _, body := post(t, srv.URL+"/decide", form, "X-Forwarded-User", "carla"); code != http.StatusSeeOther {
		t.Fatalf("carla's decision: %d %s", code, body)
	}
	stream, _ := store.Load(context.Background(), "wait")
	if d, ok := stream[len(stream)-1].Event.(events.Decision); !ok || d.By != "carla" || d.ResultID != calls["wait"].Call {
		t.Fatalf("recorded %#v", stream[len(stream)-1].Event)
	}
}

// TestAWriterAnswersOnlyToItsHostNames: a page of another site whose DNS
// name was rebound to the viewer's address is, to the browser, of the
// viewer's origin (Sec-Fetch-Site same-origin, Origin its own name); only
// the Host it asked for tells it apart. A writer viewer refuses such a
// request on every route — it can neither read the token nor decide — and
// answers to localhost, loopback addresses, or the names it is given.
func TestAWriterAnswersOnlyToItsHostNames(t *testing.T) {
	store, srv, calls := writerFixture(t)
	send := func(t *testing.T, host, method, path, body string) int {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		if method == http.MethodPost {
			req.Header.Set("Origin", "http://"+host)
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// The token a page of the viewer's own origin reads.
	code, _, body := get(t, srv.URL+"/api/verify?run=wait")
	var v struct {
		Token string `json:"decide_token"`
	}
	if err := json.Unmarshal([]byte(body), &v); code != http.StatusOK || err != nil || v.Token == "" {
		t.Fatalf("/api/verify from loopback: %d %v, no token", code, err)
	}
	approve := `{"token":"` + v.Token + `","run_id":"wait","call":"` + calls["wait"].Call + `","verdict":"approved","arguments":{"amount":499}}`
	before := store.Transactions()
	for _, path := range []string{"/", "/run?run=wait", "/api/verify?run=wait"} {
		if code := send(t, "evil.example:8080", http.MethodGet, path, ""); code != http.StatusMisdirectedRequest {
			t.Errorf("GET %s for a rebound name: %d, want 421", path, code)
		}
	}
	if code := send(t, "evil.example:8080", http.MethodPost, "/api/decide", approve); code != http.StatusMisdirectedRequest {
		t.Errorf("POST /api/decide for a rebound name: %d, want 421", code)
	}
	// The refusal says where the names are given: in Go, and on the
	// command line.
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
	req.Host = "evil.example:8080"
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := `does not answer to host "evil.example:8080" (viewer.Options.Hosts; polyloop-admin serve --hosts)`; !strings.Contains(string(b), want) {
			t.Errorf("the 421 says %q, want it to say %q", b, want)
		}
	}
	if store.Transactions() != before {
		t.Fatal("a rebound name's request wrote to the store")
	}
	for _, host := range []string{"localhost:8080", "127.0.0.1", "[::1]:9"} {
		if code := send(t, host, http.MethodGet, "/api/verify?run=wait", ""); code != http.StatusOK {
			t.Errorf("GET for host %s: %d, want 200", host, code)
		}
	}

	named := writerOptions(store)
	named.Hosts = []string{"review.internal:8080"}
	srv2 := httptest.NewServer(viewer.New(store, named))
	defer srv2.Close()
	srv = srv2
	if code := send(t, "review.internal:8080", http.MethodGet, "/api/verify?run=wait", ""); code != http.StatusOK {
		t.Errorf("GET for a name in Options.Hosts: %d, want 200", code)
	}
	if code := send(t, "localhost:8080", http.MethodGet, "/api/verify?run=wait", ""); code != http.StatusMisdirectedRequest {
		t.Errorf("GET for localhost when Options.Hosts names others: %d, want 421", code)
	}
	// A viewer that only reads answers to any name, as it always did.
	srv3 := httptest.NewServer(viewer.New(store, viewer.Options{}))
	defer srv3.Close()
	srv = srv3
	if code := send(t, "evil.example:8080", http.MethodGet, "/api/verify?run=wait", ""); code != http.StatusOK {
		t.Errorf("a read-only viewer for any name: %d, want 200", code)
	}
}

// TestAViewerSaysWhichMethodsItTakes: a method a viewer does not take is
// refused 405, writing nothing, with what it takes: a read-only viewer GET
// and HEAD; a writer GET and HEAD, and POST to /decide and /api/decide —
// the Allow header naming the methods of the path asked for.
func TestAViewerSaysWhichMethodsItTakes(t *testing.T) {
	store, writer, _ := writerFixture(t)
	readOnly := httptest.NewServer(viewer.New(store, viewer.Options{}))
	defer readOnly.Close()
	before := store.Transactions()
	for _, c := range []struct {
		srv          *httptest.Server
		method, path string
		allow, says  string
	}{
		{readOnly, http.MethodPut, "/", "GET, HEAD", "the viewer is read-only"},
		{readOnly, http.MethodDelete, "/api/runs", "GET, HEAD", "the viewer is read-only"},
		{readOnly, http.MethodPost, "/decide", "GET, HEAD", "the viewer is read-only"},
		{writer, http.MethodPut, "/", "GET, HEAD", "this viewer takes GET and HEAD, and POST to /decide and /api/decide (a decision)"},
		{writer, http.MethodDelete, "/api/runs", "GET, HEAD", "this viewer takes GET and HEAD, and POST to /decide and /api/decide (a decision)"},
		{writer, http.MethodPut, "/api/decide", "POST", "this viewer takes GET and HEAD, and POST to /decide and /api/decide (a decision)"},
		{writer, http.MethodPatch, "/decide", "POST", "this viewer takes GET and HEAD, and POST to /decide and /api/decide (a decision)"},
		{writer, http.MethodPost, "/", "GET, HEAD", "this viewer takes GET and HEAD, and POST to /decide and /api/decide (a decision)"},
		{writer, http.MethodGet, "/api/decide", "POST", "this viewer takes GET and HEAD, and POST to /decide and /api/decide (a decision)"},
	} {
		req, _ := http.NewRequest(c.method, c.srv.URL+c.path, strings.NewReader("{}"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != c.allow || strings.TrimSpace(string(b)) != c.says {
			t.Errorf("%s %s (writer %t): %d, Allow %q, %q; want 405, Allow %q, %q", c.method, c.path, c.srv == writer,
				resp.StatusCode, resp.Header.Get("Allow"), strings.TrimSpace(string(b)), c.allow, c.says)
		}
	}
	if store.Transactions() != before {
		t.Fatal("a refused method wrote")
	}
}
