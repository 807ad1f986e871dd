package viewer

import (
	"bytes"
	"encoding/json"
	"net/http"
	"time"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/report"
)

// decision is a person's decision as the timeline shows it: the record,
// when it became durable, and the step whose action it decides.
type decision struct {
	events.Decision
	ID   string
	When time.Time
	Step int
}

// decisionJSON is a decision in /api/decisions.
type decisionJSON struct {
	ID          string         `json:"id"`
	Time        string         `json:"time"`
	Step        int            `json:"step"`
	Call        string         `json:"call"` // the action's result id
	Verdict     events.Verdict `json:"verdict"`
	By          string         `json:"by"`
	Note        string         `json:"note"`
	Arguments   *string        `json:"arguments"`   // an approval's edited arguments (JSON text)
	Observation *string        `json:"observation"` // an operator's finding of executed: what they saw
}

// decisions are the stream's decisions in order, each with the step of the
// action intent it decides.
func decisions(stream []events.Envelope) []decision {
	steps := map[string]int{} // action result id → step
	var out []decision
	for _, env := range stream {
		switch ev := env.Event.(type) {
		case events.Intent:
			if ev.IntentKind == events.IntentAction {
				steps[ev.ResultID] = ev.CallIndex
			}
		case events.Decision:
			out = append(out, decision{Decision: ev, ID: env.ID.String(), When: env.Time(), Step: steps[ev.ResultID]})
		}
	}
	return out
}

func (d decision) JSON() decisionJSON {
	return decisionJSON{ID: d.ID, Time: report.Stamp(d.When), Step: d.Step, Call: d.ResultID, Verdict: d.Verdict, By: d.By,
		Note: d.Note, Arguments: d.Arguments, Observation: d.Observation}
}

func (h *handler) decisionsJSON(w http.ResponseWriter, r *http.Request) {
	_, stream, _, ok := h.load(w, r)
	if !ok {
		return
	}
	out := []decisionJSON{}
	for _, d := range decisions(stream) {
		out = append(out, d.JSON())
	}
	writeJSON(w, out)
}

// verdictJSON is the run's JSON at /api/verify: its verdict as
// polyloop-inspect verify --json prints it (the call awaiting a person
// among it), and the token of a viewer that writes decisions.
type verdictJSON struct {
	report.VerdictJSON
	// DecideToken is the token /api/decide wants, from a viewer that
	// writes decisions (Options.Decide); absent otherwise.
	DecideToken string `json:"decide_token,omitempty"`
}

// indent is JSON text indented for reading, or the text as it is when it
// is not JSON.
func indent(text string) string {
	var b bytes.Buffer
	if json.Indent(&b, []byte(text), "", "  ") != nil {
		return text
	}
	return b.String()
}
