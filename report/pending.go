package report

import (
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
)

// PendingJSON is a call awaiting a person's decision, in JSON: its id
// (the CALL of polyloop-admin approve, reject and resolve), step, what it
// awaits (approval, resolution), the tool and its arguments (JSON text),
// the tool's parameter schema that edited arguments must satisfy (JSON
// text), its replay policy, and since when it waits; null where absent.
type PendingJSON struct {
	Call            string              `json:"call"`
	Step            int                 `json:"step"`
	Awaits          events.Awaits       `json:"awaits"`
	Tool            *string             `json:"tool"`
	Arguments       *string             `json:"arguments"`
	ArgumentsSchema *string             `json:"arguments_schema"`
	ReplayPolicy    events.ReplayPolicy `json:"replay_policy"`
	Since           *string             `json:"since"`
}

// PendingOf is p in JSON; nil for nil.
func PendingOf(p *recovery.PendingCall) *PendingJSON {
	if p == nil {
		return nil
	}
	return &PendingJSON{Call: p.Call, Step: p.Step, Awaits: p.Awaits, Tool: stringOrNil(p.Tool), Arguments: stringOrNil(p.Arguments),
		ArgumentsSchema: stringOrNil(p.ArgumentsSchema), ReplayPolicy: p.ReplayPolicy, Since: stampOrNil(p.Since)}
}

// AwaitsPerson reports whether a run with status s waits for a person
// (awaiting_approval, awaiting_resolution): nobody drives it, and no
// worker or Resume continues it before a decision is recorded.
func AwaitsPerson(s seams.RunStatus) bool {
	return s == seams.StatusAwaitingApproval || s == seams.StatusAwaitingResolution
}
