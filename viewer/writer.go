package viewer

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/report"
	"github.com/polyloop/polyloop/seams"
)

// maxDecisionBody bounds a decision's request body: a note, edited
// arguments and an observation, each at most events.MaxTextBytes, and the
// rest of the form.
const maxDecisionBody = 3*events.MaxTextBytes + 64<<10

// errNoReviewer is the refusal of a writer mounted without a name to
// record decisions by.
var errNoReviewer = errors.New("viewer: mounted to write decisions without naming who makes them (set Options.Reviewer or Options.By)")

// tokenOK reports whether token is the handler's.
func (h *handler) tokenOK(token string) bool {
	return subtle.ConstantTimeCompare([]byte(token), []byte(h.token)) == 1
}

// hostAllowed reports whether a writer viewer answers to host (a
// request's Host header): one of Options.Hosts, or, when there are none,
// localhost or a loopback address, with any port.
func (h *handler) hostAllowed(host string) bool {
	if len(h.o.Hosts) > 0 {
		for _, allowed := range h.o.Hosts {
			if strings.EqualFold(host, allowed) {
				return true
			}
		}
		return false
	}
	name := host
	if n, _, err := net.SplitHostPort(host); err == nil {
		name = n
	}
	name = strings.TrimSuffix(strings.TrimPrefix(name, "["), "]")
	if strings.EqualFold(name, "localhost") {
		return true
	}
	ip := net.ParseIP(name)
	return ip != nil && ip.IsLoopback()
}

// badToken is the refusal of a request without the handler's token.
const badToken = "the decision does not carry this viewer's token: reload the run's page and decide again"

// decide records d (its By from the request) through Options.Decide,
// answering the status of a refusal with it: 403 when Options.By names
// nobody, 400 for a verdict that is none, DecisionStatus of Decide's
// refusals.
func (h *handler) decide(r *http.Request, d events.Decision) (events.Envelope, int, error) {
	if err := seams.ValidRunID(d.RunID); err != nil {
		return events.Envelope{}, http.StatusBadRequest, err
	}
	if !d.Verdict.Valid() {
		return events.Envelope{}, http.StatusBadRequest, fmt.Errorf("verdict %q: want approved, rejected, executed or not_executed", report.Clip(string(d.Verdict), 40))
	}
	by, err := h.by(r)
	switch {
	case errors.Is(err, errNoReviewer):
		return events.Envelope{}, http.StatusInternalServerError, err
	case err != nil:
		return events.Envelope{}, http.StatusForbidden, fmt.Errorf("who decides? %w", err)
	}
	d.By = by
	env, err := h.o.Decide(r.Context(), d)
	if err != nil {
		return env, DecisionStatus(err), err
	}
	return env, http.StatusOK, nil
}

// DecisionStatus is the HTTP status that answers a refusal of a decision,
// by the seams' refusals the engine's Decide and Resolve return: 400 for
// an invalid decision, 404 for a run or call that is not there, 409 for a
// call that does not await that decision or is already decided, a run a
// driver holds or whose tail moved, and a damaged run; 500 otherwise.
func DecisionStatus(err error) int {
	switch {
	case errors.Is(err, seams.ErrInvalidDecision):
		return http.StatusBadRequest
	case errors.Is(err, seams.ErrNoRun), errors.Is(err, seams.ErrNoSuchCall):
		return http.StatusNotFound
	case errors.Is(err, seams.ErrNotPending), errors.Is(err, seams.ErrAlreadyDecided), errors.Is(err, seams.ErrRunLocked),
		errors.Is(err, seams.ErrTailMoved), errors.Is(err, events.ErrCorruption):
		return http.StatusConflict
	}
	return http.StatusInternalServerError
}

// by names who decides on r: Options.By, or Options.Reviewer.
func (h *handler) by(r *http.Request) (string, error) {
	if h.o.By != nil {
		return h.o.By(r)
	}
	if h.o.Reviewer == "" {
		return "", errNoReviewer
	}
	return h.o.Reviewer, nil
}

// decideForm records the decision a run page's form posts (fields token,
// run, call, verdict, note, arguments, observation) and sends the browser
// back to the run's page; a refusal is the run's page saying why, with its
// status.
func (h *handler) decideForm(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxDecisionBody)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "the decision's form does not parse: "+err.Error(), http.StatusBadRequest)
		return
	}
	f := r.PostForm
	if !h.tokenOK(f.Get("token")) {
		http.Error(w, badToken, http.StatusForbidden)
		return
	}
	id := f.Get("run")
	d := events.Decision{RunID: id, ResultID: f.Get("call"), Verdict: events.Verdict(f.Get("verdict")), Note: f.Get("note")}
	if a := f.Get("arguments"); strings.TrimSpace(a) != "" {
		d.Arguments = &a
	}
	if o := f.Get("observation"); o != "" {
		d.Observation = &o
	}
	_, code, err := h.decide(r, d)
	switch {
	case err == nil:
		// Relative to the page that posted: the viewer may be mounted
		// under any prefix.
		w.Header().Set("Location", "run?"+url.Values{"id": {id}}.Encode())
		w.WriteHeader(http.StatusSeeOther)
	case seams.ValidRunID(id) != nil:
		http.Error(w, err.Error(), code)
	default:
		f.Del("token")
		h.showRun(w, r, id, &refusal{code: code, why: err.Error(), form: f})
	}
}

// decideRequest is a decision posted to /api/decide.
type decideRequest struct {
	Token   string         `json:"token"` // the handler's (decide_token in /api/verify)
	RunID   string         `json:"run_id"`
	Call    string         `json:"call"`
	Verdict events.Verdict `json:"verdict"`
	Note    string         `json:"note"`
	// Arguments are an approval's edited arguments: a JSON object.
	Arguments   json.RawMessage `json:"arguments"`
	Observation *string         `json:"observation"`
}

// decideJSON records a decision posted as JSON, answering its event
// (report.EventJSON) or {"error": why} with the refusal's status.
func (h *handler) decideJSON(w http.ResponseWriter, r *http.Request) {
	refuse := func(code int, why string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(map[string]string{"error": why})
	}
	var req decideRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxDecisionBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		refuse(http.StatusBadRequest, "the decision does not parse: "+err.Error())
		return
	}
	if !h.tokenOK(req.Token) {
		refuse(http.StatusForbidden, badToken)
		return
	}
	d := events.Decision{RunID: req.RunID, ResultID: req.Call, Verdict: req.Verdict, Note: req.Note, Observation: req.Observation}
	if len(req.Arguments) > 0 && string(req.Arguments) != "null" {
		a := string(req.Arguments)
		d.Arguments = &a
	}
	env, code, err := h.decide(r, d)
	if err != nil {
		refuse(code, err.Error())
		return
	}
	writeJSON(w, report.Event(env))
}
