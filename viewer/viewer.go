// Package viewer is a web view of a store's runs: an http.Handler a
// service mounts beside its agents, or that `polyloop-inspect serve`
// (read-only) and `polyloop-admin serve` (recording decisions) serve from
// a file or a postgres:// URL. It only reads, unless mounted to record
// people's decisions (see Decisions).
//
//	mux.Handle("/runs/", http.StripPrefix("/runs", viewer.New(store, viewer.Options{})))
//
// Pages (server-rendered with html/template; a few lines of plain
// JavaScript refresh an unfinished run's page when it gets new events, or
// when a driver stops or takes it):
//
//	/                 the runs, newest first: status, agent, holder, stop
//	                  reason, steps, tokens, started, last event, and for
//	                  a fork the run it was forked from and the step;
//	                  filterable (?status=, ?stop_reason=, ?since=, ?limit=)
//	/run?id=ID        a run: above all, the call it awaits a person's
//	                  decision on, if any (what it awaits — approval or
//	                  resolution — the tool, its arguments, the call's id,
//	                  since when); who drives it (its holder and lease, or
//	                  that nobody does), its verdict — for a run nobody
//	                  holds, the side effect in doubt and what Resume
//	                  would do — and the step timeline (parse result,
//	                  action, tool, status, prompt size, tokens, wall time
//	                  as a bar, the observation expandable), each decision
//	                  a row below its step's: who, verdict, when, note,
//	                  edited arguments, observation; its lineage: "forked
//	                  from RUN at step K" (a link), which steps are
//	                  copied, the parameter differences and the never
//	                  actions the source executed from step K on, which
//	                  the fork does not see; and the runs forked from it
//	                  (links) — finding them reads the first event of
//	                  every run of the store
//
// JSON, with the names polyloop-inspect prints with --json:
//
//	/api/runs                 the runs (same filters), each with its
//	                          lineage (forked_from,
//	                          source_never_actions_after, forks)
//	/api/events?run=ID        the events
//	/api/steps?run=ID         the StepRecords (exactly their eighteen fields)
//	/api/verify?run=ID        the verdict, and the call awaiting a person
//	                          (pending: a report.PendingJSON, or null),
//	                          and the run's lineage (report.Lineage);
//	                          from a writer, decide_token too
//	/api/decisions?run=ID     the decisions, each with its step (the
//	                          steps' JSON keeps the eighteen fields)
//	/api/follow?run=ID        new events as server-sent events, from the
//	                          &after= event count on; ends after run_finished,
//	                          or with an error event when the run is damaged,
//	                          deleted or replaced (report.Follower); a
//	                          liveness event each time nobody drives the run
//	                          any more, or a driver takes it, as against
//	                          &live= (running, awaiting or interrupted: what
//	                          the client shows; running if absent)
//
// A follow stream of a run in progress lasts until the client leaves or the
// request's context ends, and http.Server.Shutdown waits for it: a service
// that mounts the viewer gives its server a BaseContext it cancels when it
// shuts down.
//
// Run ids go in the query, not the path: an id may hold any character a
// run id may (seams.ValidRunID). A request naming an id no store keeps is
// answered 400 with what is wrong with it, on every store alike.
//
// Everything a run holds is untrusted model output and is escaped; pages
// carry a Content-Security-Policy that allows no inline script. Without
// Options.Decide the handler only reads (GET and HEAD; anything else is
// 405); with it, it takes POST to /decide and /api/decide as well (any
// other method, or path for POST, is 405, the Allow header naming the
// path's methods).
//
// # Decisions
//
// Mounted with Options.Decide, the viewer records people's decisions too,
// and writes nothing else. The page of a run nobody drives whose call
// awaits approval offers approve (with a note, and edited arguments that
// the tool's schema must accept) and reject (with a note, which the model
// is told); one whose action awaits a resolution, or was left in doubt,
// offers resolve: executed (with what was seen of it) or not executed.
// The buttons POST a form to /decide, which records the decision and sends
// the browser back to the run's page; refused, the run's page comes back
// saying why (with the refusal's status), the form's entries kept. The
// same decision as JSON:
//
//	POST /api/decide  {"token", "run_id", "call", "verdict", "note",
//	                  "arguments" (a JSON object), "observation"}:
//	                  the decision's event, or {"error": why} with 400
//	                  (invalid), 403 (refused: no token, Options.By's
//	                  refusal; in plain text, a request from another
//	                  site), 404 (no such run or call),
//	                  409 (not pending, already decided, the run driven
//	                  meanwhile, or damaged), 500 (no name to record it
//	                  by, or another failure of Decide: DecisionStatus);
//	                  and 421 (in plain text), as on every route, for a
//	                  host name the writer does not answer to (below)
//
// A decision must carry the handler's secret token (a hidden field of the
// page's forms; decide_token in /api/verify), and a browser's request from
// another origin is refused (net/http.CrossOriginProtection, which reads
// Sec-Fetch-Site and Origin): 403 either way, writing nothing. No other
// site may frame the pages. A page of another site whose DNS name was
// rebound to the viewer's address would pass both as the viewer's own
// origin, so a writer answers only to the host names it is reached by
// (Options.Hosts; localhost and loopback addresses by default) and
// refuses every other (421), reads included. Who decided is Options.By of the request, or
// else the fixed Options.Reviewer.
//
// The viewer does not import the engine: the mounter hands it the
// engine's verbs, routed by verdict; their refusals are the seams' (seams
// /decision.go), which DecisionStatus answers with an HTTP status:
//
//	viewer.New(store, viewer.Options{
//		Decide: func(ctx context.Context, d events.Decision) (events.Envelope, error) {
//			if d.Verdict.Resolves() {
//				return engine.Resolve(ctx, store, d)
//			}
//			return engine.Decide(ctx, store, d)
//		},
//		Reviewer: "ops-desk",
//	})
//
// What does not live here: what a run's status or verdict is (packages
// report and recovery) and any store (it reads a seams.RunReader).
package viewer

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/projections"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/report"
	"github.com/polyloop/polyloop/seams"
)

//go:embed templates/*.html static/*
var assets embed.FS

// Options configure New.
type Options struct {
	// Poll is how often the follow endpoint looks for new events (default
	// 250ms).
	Poll time.Duration

	// Decide, when set, makes the viewer a writer of decisions (see
	// "Decisions" in the package doc): it records d — an approval or
	// rejection of a call awaiting approval, or an operator's finding
	// (executed, not executed; d.Verdict.Resolves()) on an action in
	// doubt — and returns its event. The mounter routes d by its verdict:
	// engine.Decide for an approval's answer, engine.Resolve for a
	// finding. The viewer fills in d.By (By, Reviewer); an error is the
	// refusal shown to the person, with its DecisionStatus. Nil: the
	// viewer only reads.
	Decide func(ctx context.Context, d events.Decision) (events.Envelope, error)
	// By names who makes the decision a request posts (Decision.By): the
	// person a proxy or session authenticated, say. An error refuses the
	// decision (403, with the error's text). Nil: Reviewer.
	By func(r *http.Request) (string, error)
	// Reviewer is the fixed name decisions are recorded by when By is
	// nil: one person, or the one desk, that this viewer serves. With
	// neither, every decision is refused (500, saying so).
	Reviewer string
	// Hosts are the names (host or host:port, as a request's Host header
	// says them) a viewer that writes decisions answers to; any other is
	// refused (421) on every route. A page of another site whose DNS name
	// was rebound to this server's address is, to the browser, of the
	// same origin as the viewer — only the name it asked for tells it
	// apart. Empty: localhost and loopback addresses only. Ignored by a
	// viewer that only reads.
	Hosts []string
}

type handler struct {
	store seams.RunReader
	o     Options
	pages *template.Template
	mux   *http.ServeMux
	token string // a writer's: the secret each decision posted must carry
}

// New returns the viewer over store. It never writes unless o.Decide is
// set, and then only through o.Decide.
func New(store seams.RunReader, o Options) http.Handler {
	if o.Poll <= 0 {
		o.Poll = 250 * time.Millisecond
	}
	h := &handler{store: store, o: o, mux: http.NewServeMux()}
	h.pages = template.Must(template.New("").Funcs(template.FuncMap{
		"stamp": report.Stamp, "tokens": tokensText, "deref": deref, "plural": report.Plural, "indent": indent,
	}).ParseFS(assets, "templates/*.html"))
	static, _ := fs.Sub(assets, "static")
	h.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	h.mux.HandleFunc("GET /{$}", h.runsPage)
	h.mux.HandleFunc("GET /run", h.runPage)
	h.mux.HandleFunc("GET /api/runs", h.runsJSON)
	h.mux.HandleFunc("GET /api/events", h.eventsJSON)
	h.mux.HandleFunc("GET /api/steps", h.stepsJSON)
	h.mux.HandleFunc("GET /api/verify", h.verifyJSON)
	h.mux.HandleFunc("GET /api/decisions", h.decisionsJSON)
	h.mux.HandleFunc("GET /api/follow", h.follow)
	if o.Decide != nil {
		h.token = rand.Text()
		// Browsers say where a request comes from: refuse any other
		// site's (before the token is even looked at).
		cross := http.NewCrossOriginProtection()
		h.mux.Handle("POST /decide", cross.Handler(http.HandlerFunc(h.decideForm)))
		h.mux.Handle("POST /api/decide", cross.Handler(http.HandlerFunc(h.decideJSON)))
	}
	return h
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.o.Decide != nil && !h.hostAllowed(r.Host) {
		// A rebound DNS name: its pages would read the token and decide.
		http.Error(w, fmt.Sprintf("this viewer writes decisions and does not answer to host %q (viewer.Options.Hosts; polyloop-admin serve --hosts)", report.Clip(r.Host, 80)),
			http.StatusMisdirectedRequest)
		return
	}
	if allow := h.methods(r.URL.Path); !slices.Contains(allow, r.Method) {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		why := "the viewer is read-only"
		if h.o.Decide != nil {
			why = "this viewer takes GET and HEAD, and POST to /decide and /api/decide (a decision)"
		}
		http.Error(w, why, http.StatusMethodNotAllowed)
		return
	}
	csp := "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; form-action 'self'"
	if h.o.Decide != nil { // no other page may frame the buttons (clickjacking)
		csp += "; frame-ancestors 'none'"
		w.Header().Set("X-Frame-Options", "DENY")
	}
	w.Header().Set("Content-Security-Policy", csp)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	h.mux.ServeHTTP(w, r)
}

// methods are the methods the handler takes for path: POST alone for a
// writer's /decide and /api/decide, GET and HEAD for every other path.
func (h *handler) methods(path string) []string {
	if h.o.Decide != nil && (path == "/decide" || path == "/api/decide") {
		return []string{http.MethodPost}
	}
	return []string{http.MethodGet, http.MethodHead}
}

// filter reads the listing filters from the query.
func filter(r *http.Request) (report.Filter, error) {
	q := r.URL.Query()
	f := report.Filter{Status: nonEmpty[seams.RunStatus](q["status"]), StopReason: nonEmpty[string](q["stop_reason"])}
	if s := q.Get("since"); s != "" {
		t, err := report.ParseSince(s, time.Now())
		if err != nil {
			return f, err
		}
		f.Since = t
	}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			return f, fmt.Errorf("limit %q is not a number", s)
		}
		f.Limit = n
	}
	return f, f.Check()
}

// nonEmpty is the values of a query parameter that are not empty.
func nonEmpty[T ~string](v []string) []T {
	var out []T
	for _, s := range v {
		if s != "" {
			out = append(out, T(s))
		}
	}
	return out
}

// runs lists the filtered runs, answering the error itself.
func (h *handler) runs(w http.ResponseWriter, r *http.Request) ([]report.Run, report.Filter, bool) {
	f, err := filter(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return nil, f, false
	}
	all, err := report.List(r.Context(), h.store)
	if err != nil {
		http.Error(w, "the store cannot be read: "+err.Error(), http.StatusInternalServerError)
		return nil, f, false
	}
	return f.Apply(all), f, true
}

// load loads the run the query names, answering a failure itself. A
// damaged stream is returned with its error (the pages show the damage).
func (h *handler) load(w http.ResponseWriter, r *http.Request) (string, []events.Envelope, error, bool) {
	id, ok := runID(w, r)
	if !ok {
		return id, nil, nil, false
	}
	stream, err, ok := h.loadRun(w, r, id, "")
	return id, stream, err, ok
}

// loadRun loads run id as load does; a run the store does not hold is
// answered 404 with missing, or with "no run" when missing is empty.
func (h *handler) loadRun(w http.ResponseWriter, r *http.Request, id, missing string) ([]events.Envelope, error, bool) {
	stream, err := h.store.Load(r.Context(), id)
	var damage *events.DamageError
	switch {
	case err != nil && !errors.As(err, &damage):
		http.Error(w, "the store cannot be read: "+err.Error(), http.StatusInternalServerError)
		return nil, nil, false
	case err == nil && len(stream) == 0:
		if missing == "" {
			missing = fmt.Sprintf("no run %q", report.Clip(id, 80))
		}
		http.Error(w, missing, http.StatusNotFound)
		return nil, nil, false
	}
	return stream, err, true
}

// runID is the run a request names (?run=, or ?id= on the run page). It
// answers a missing or invalid id itself (400, saying what is wrong with
// it: the rule's text, never a store's).
func runID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.URL.Query().Get("run")
	if id == "" {
		id = r.URL.Query().Get("id")
	}
	if id == "" {
		http.Error(w, "which run? (?run=ID)", http.StatusBadRequest)
		return id, false
	}
	if err := seams.ValidRunID(id); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return id, false
	}
	return id, true
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(true) // JSON read by a browser: no raw < > &
	enc.Encode(v)
}

func (h *handler) runsJSON(w http.ResponseWriter, r *http.Request) {
	runs, _, ok := h.runs(w, r)
	if !ok {
		return
	}
	out := make([]report.RunJSON, len(runs))
	for i, run := range runs {
		out[i] = run.JSON()
	}
	writeJSON(w, out)
}

func (h *handler) eventsJSON(w http.ResponseWriter, r *http.Request) {
	_, stream, _, ok := h.load(w, r)
	if !ok {
		return
	}
	out := make([]report.EventJSON, len(stream))
	for i, env := range stream {
		out[i] = report.Event(env)
	}
	writeJSON(w, out)
}

func (h *handler) stepsJSON(w http.ResponseWriter, r *http.Request) {
	_, stream, _, ok := h.load(w, r)
	if !ok {
		return
	}
	writeJSON(w, projections.Fold(stream).Trajectory())
}

func (h *handler) verifyJSON(w http.ResponseWriter, r *http.Request) {
	id, stream, loadErr, ok := h.load(w, r)
	if !ok {
		return
	}
	info, ok := h.describe(w, r, id)
	if !ok {
		return
	}
	run := report.Classify(info, stream, loadErr)
	if !h.trace(w, r, &run) {
		return
	}
	writeJSON(w, verdictJSON{VerdictJSON: report.Verdict(run, stream), DecideToken: h.token})
}

// trace completes run's lineage (report.Trace): its forks, found by
// reading the first event of every run of the store (report.FindForks),
// and for a fork, what its source executed that it does not see. It
// answers a store failure itself.
func (h *handler) trace(w http.ResponseWriter, r *http.Request, run *report.Run) bool {
	infos, err := h.store.Runs(r.Context())
	if err == nil {
		var forks report.Forks
		if forks, err = report.FindForks(r.Context(), h.store, infos); err == nil {
			report.Trace(r.Context(), h.store, run, forks)
			return true
		}
	}
	http.Error(w, "the store cannot be read: "+err.Error(), http.StatusInternalServerError)
	return false
}

// describe is the run's entry as the store lists it, with its holder
// (report.Describe), answering a store failure itself. A run whose entry
// the store lacks or finds damaged (its stream was loaded, and says what
// is wrong) is described by its id alone.
func (h *handler) describe(w http.ResponseWriter, r *http.Request, id string) (seams.RunInfo, bool) {
	info, err := report.Describe(r.Context(), h.store, id)
	switch {
	case errors.Is(err, seams.ErrNoRun) || errors.Is(err, events.ErrCorruption):
		return seams.RunInfo{RunID: id}, true
	case err != nil:
		http.Error(w, "the store cannot be read: "+err.Error(), http.StatusInternalServerError)
		return info, false
	}
	return info, true
}

// livenessJSON is a follow stream's liveness event: who drives the run.
type livenessJSON struct {
	RunID    string          `json:"run_id"`
	Status   seams.RunStatus `json:"status"` // running, awaiting or interrupted
	Liveness string          `json:"liveness"`
	report.LivenessJSON
}

// follow streams the run's events from ?after= (a count of events already
// seen) as server-sent events, as a report.Follower reads them, until
// run_finished or the client leaves; damage, or a run deleted or replaced
// meanwhile, ends the stream with an error event.
func (h *handler) follow(w http.ResponseWriter, r *http.Request) {
	id, ok := runID(w, r)
	if !ok {
		return
	}
	after := 0
	if a := r.URL.Query().Get("after"); a != "" {
		n, err := strconv.Atoi(a)
		if err != nil || n < 0 {
			http.Error(w, fmt.Sprintf("after %q: want a count of events already seen (0 or more)", report.Clip(a, 40)), http.StatusBadRequest)
			return
		}
		after = n
	}
	f := report.NewFollower(h.store, id)
	if l := r.URL.Query().Get("live"); l != "" {
		switch live := seams.RunStatus(l); live {
		case seams.StatusRunning, seams.StatusAwaiting, seams.StatusInterrupted:
			f.Shown(live)
		default:
			http.Error(w, fmt.Sprintf("live %q: want running, awaiting or interrupted", report.Clip(l, 40)), http.StatusBadRequest)
			return
		}
	}
	first, err := f.Next(r.Context())
	if errors.Is(err, seams.ErrNoRun) {
		http.Error(w, fmt.Sprintf("no run %q", report.Clip(id, 80)), http.StatusNotFound)
		return
	}
	if r.Method == http.MethodHead {
		w.Header().Set("Content-Type", "text/event-stream")
		return
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	flusher.Flush()
	// send writes the events the client has not seen, each with its
	// number in the stream as its id.
	send := func(batch []events.Envelope) error {
		for i, env := range batch {
			if n := f.Seen() - len(batch) + i + 1; n > after {
				b, _ := json.Marshal(report.Event(env))
				fmt.Fprintf(w, "id: %d\ndata: %s\n\n", n, b)
			}
		}
		flusher.Flush()
		return nil
	}
	// live says who drives the run, when that changes.
	live := func(info seams.RunInfo) error {
		b, _ := json.Marshal(livenessJSON{RunID: id, Status: info.Status, Liveness: report.Liveness(info.Status, info, time.Now()),
			LivenessJSON: report.LivenessOf(info)})
		fmt.Fprintf(w, "event: liveness\ndata: %s\n\n", b)
		flusher.Flush()
		return nil
	}
	if err == nil {
		send(first)
		if !f.Finished() {
			err = f.Follow(r.Context(), h.o.Poll, send, live)
		}
	}
	if err != nil && r.Context().Err() == nil {
		fmt.Fprintf(w, "event: error\ndata: %s\n\n", jsonString(err.Error()))
		flusher.Flush()
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// Pages.

type runsPage struct {
	Runs     []report.Run
	Statuses []seams.RunStatus
	Reasons  []events.StopReason
	Filter   report.Filter
	Query    map[string]string
}

func (h *handler) runsPage(w http.ResponseWriter, r *http.Request) {
	runs, f, ok := h.runs(w, r)
	if !ok {
		return
	}
	reasons := append(events.StopReasons[:len(events.StopReasons):len(events.StopReasons)], events.StopTokenBudget)
	q := map[string]string{}
	for _, k := range []string{"status", "stop_reason", "since", "limit"} {
		q[k] = r.URL.Query().Get(k)
	}
	h.render(w, http.StatusOK, "runs.html", runsPage{Runs: runs, Statuses: seams.RunStatuses, Reasons: reasons, Filter: f, Query: q})
}

// stepRow is a step of the timeline.
type stepRow struct {
	events.StepRecord
	Tokens    *events.Usage
	WallPct   int                    // the step's wall time as a share of the longest step's
	EnvError  string                 // the stored cause of an env_error
	Decisions []projections.Decision // the decisions on the step's action
}

type runPage struct {
	RunID     string
	FollowURL string // the follow endpoint from this page's events on
	Run       report.Run
	Verdict   report.VerdictJSON
	Steps     []stepRow
	Finished  bool
	Live      seams.RunStatus // an unfinished run's liveness: running, awaiting or interrupted
	Holder    string          // report.Holder
	// Pending is the call the run's log says awaits a person, nil when
	// none does; Person says that nobody drives the run until a person
	// decides (its status is awaiting_approval or awaiting_resolution).
	Pending *recovery.PendingCall
	Person  bool
	// Deciding are the decisions on the step in progress.
	Deciding []projections.Decision
	// Lineage is where the run was forked from and its forks
	// (report.Trace); Copied and Unseen are report.Copied's and
	// Lineage.Unseen's words.
	Lineage report.Lineage
	Copied  string
	// Ancestors are a fork of a fork's copied steps by the run they
	// first ran in (report.Ancestors).
	Ancestors []report.AncestorSteps
	Unseen    string

	// A viewer that writes decisions (Options.Decide) offers them for
	// DecideCall, the call of a run nobody drives that awaits a person or
	// whose action is in doubt (report.Run.Decidable): approval (approve,
	// reject) or resolution (executed, not executed). Token is the handler's; Refused says why
	// a decision just posted was refused, and Form is what was posted.
	DecideCall string
	DecideKind events.Awaits
	Token      string
	Refused    string
	Form       url.Values
}

// Prefill is what a refused decision's form held in field, for the form
// of verdict: the entries a person typed are kept.
func (p runPage) Prefill(verdict, field string) string {
	if p.Form.Get("verdict") != verdict {
		return ""
	}
	return p.Form.Get(field)
}

// refusal is a decision refused: its status and why, and the form posted.
type refusal struct {
	code int
	why  string
	form url.Values
}

func (h *handler) runPage(w http.ResponseWriter, r *http.Request) {
	if id, ok := runID(w, r); ok {
		h.showRun(w, r, id, nil)
	}
}

// showRun renders run id's page, with a decision's refusal when there is
// one (then with its status; a run the store lacks is answered with why
// the decision was refused).
func (h *handler) showRun(w http.ResponseWriter, r *http.Request, id string, refused *refusal) {
	missing := ""
	if refused != nil {
		missing = refused.why
	}
	stream, loadErr, ok := h.loadRun(w, r, id, missing)
	if !ok {
		return
	}
	info, ok := h.describe(w, r, id)
	if !ok {
		return
	}
	log := projections.Fold(stream)
	run := report.Classify(info, stream, loadErr)
	if !h.trace(w, r, &run) {
		return
	}
	page := runPage{RunID: id, Run: run, Verdict: report.Verdict(run, stream), Finished: log.Finished != nil,
		Live: report.Live(run.Info, run.Now), Holder: run.Holder(), Lineage: run.Lineage, Unseen: run.Lineage.Unseen()}
	if o := run.Lineage.ForkedFrom; o != nil {
		page.Copied = report.Copied(*o, func(id string) string { return id })
		page.Ancestors = report.Ancestors(*o)
	}
	page.FollowURL = "api/follow?" + url.Values{"run": {id}, "after": {strconv.Itoa(len(stream))}, "live": {string(page.Live)}}.Encode()
	causes := map[int]string{}
	for _, e := range page.Verdict.EnvErrors { // worked out once, by report.Verdict
		causes[e.Step] = e.Cause
	}
	tokens := report.StepTokens(log)
	trajectory := log.Trajectory()
	longest := int64(1)
	for _, s := range trajectory {
		longest = max(longest, s.StepWallMs)
	}
	for i, s := range trajectory {
		page.Steps = append(page.Steps, stepRow{StepRecord: s, Tokens: tokens[i], WallPct: int(s.StepWallMs * 100 / longest),
			EnvError: causes[s.StepIdx]})
	}
	for _, d := range log.Decisions {
		if d.Step < len(page.Steps) {
			page.Steps[d.Step].Decisions = append(page.Steps[d.Step].Decisions, d)
		} else {
			page.Deciding = append(page.Deciding, d)
		}
	}
	page.Pending = run.Verdict.Pending
	page.Person = report.AwaitsPerson(run.Status)
	if h.o.Decide != nil {
		page.Token = h.token
		if p := run.Decidable(); p != nil {
			page.DecideCall, page.DecideKind = p.Call, p.Awaits
		}
	}
	code := http.StatusOK
	if refused != nil {
		code, page.Refused, page.Form = refused.code, refused.why, refused.form
	}
	h.render(w, code, "run.html", page)
}

func (h *handler) render(w http.ResponseWriter, code int, name string, data any) {
	var b strings.Builder
	if err := h.pages.ExecuteTemplate(&b, name, data); err != nil {
		http.Error(w, "render: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	w.Write([]byte(b.String()))
}

func tokensText(u *events.Usage) string {
	if u == nil {
		return "-"
	}
	var t events.UsageTotals
	t.Add(u)
	return strconv.FormatInt(t.Total(), 10)
}

func deref(p any) string {
	switch v := p.(type) {
	case *string:
		if v != nil {
			return *v
		}
	case *events.ActionStatus:
		if v != nil {
			return string(*v)
		}
	}
	return "-"
}
