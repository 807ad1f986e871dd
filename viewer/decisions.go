package viewer

import (
	"bytes"
	"encoding/json"
	"net/http"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/projections"
	"github.com/polyloop/polyloop/report"
)

// decisionJSON is a decision in /api/decisions, its time stamped as the
// viewer's other endpoints stamp theirs.
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

func toJSON(d projections.Decision) decisionJSON {
	return decisionJSON{ID: d.ID.String(), Time: report.Stamp(d.At), Step: d.Step, Call: d.Call, Verdict: d.Verdict, By: d.By,
		Note: d.Note, Arguments: d.Arguments, Observation: d.Observation}
}

func (h *handler) decisionsJSON(w http.ResponseWriter, r *http.Request) {
	_, stream, _, ok := h.load(w, r)
	if !ok {
		return
	}
	out := []decisionJSON{}
	for _, d := range projections.Fold(stream).Decisions {
		out = append(out, toJSON(d))
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
