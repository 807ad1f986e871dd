package report

import (
	"fmt"
	"io"
	"regexp"
	"strings"

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

// Decidable is the call of r a person may decide on now, nil when there
// is none: the call r awaits a person for (its status awaiting_approval or
// awaiting_resolution), or, when nobody drives r and its log leaves an
// action in doubt (in_doubt), that action, as a call awaiting an
// operator's finding (resolution) since a time not known. A finished,
// corrupt or held run, one between steps, and a model call in doubt, which
// no person resolves, have none.
func (r Run) Decidable() *recovery.PendingCall {
	v := r.Verdict
	switch {
	case r.Err != nil:
	case AwaitsPerson(r.Status):
		return v.Pending
	case r.Status == seams.StatusInDoubt && v.InDoubt != nil && v.InDoubt.IntentKind == events.IntentAction:
		in := v.InDoubt
		return &recovery.PendingCall{Call: in.ResultID, Step: in.CallIndex, Awaits: events.AwaitsResolution, Tool: in.ToolName,
			Arguments: in.Arguments, ArgumentsSchema: in.ArgumentsSchema, ReplayPolicy: in.ReplayPolicy}
	}
	return nil
}

// DecisionCommand is a polyloop-admin command line that decides a pending
// call, and what it says of the call.
type DecisionCommand struct {
	Says string // "approve", "reject"; "it ran", "it did not run"
	// Line is the command, runnable as it is up to the options in
	// brackets at its end; TEXT and JSON are for the person to write.
	Line string
}

// DecisionCommands are the polyloop-admin command lines that decide p, a
// call of runID in the store named store — as stores.Describe names it,
// a password masked: approve and reject for an approval, resolve
// --executed and --not-executed for an operator's finding. Each word is
// quoted for a POSIX shell where it needs to be.
func DecisionCommands(store, runID string, p recovery.PendingCall) []DecisionCommand {
	target := strings.Join([]string{shellWord(store), shellWord(runID), shellWord(p.Call)}, " ")
	if p.Awaits == events.AwaitsResolution {
		return []DecisionCommand{
			{"it ran", "polyloop-admin resolve " + target + " --executed --observation TEXT"},
			{"it did not run", "polyloop-admin resolve " + target + " --not-executed"},
		}
	}
	edit := ""
	if p.ArgumentsSchema != "" {
		edit = " [--arguments JSON]"
	}
	return []DecisionCommand{
		{"approve", "polyloop-admin approve " + target + " [--note TEXT]" + edit},
		{"reject", "polyloop-admin reject " + target + " [--note TEXT]"},
	}
}

// WriteDecisionCommands writes cmds to w, one a line: indent, what the
// command says and a colon, padded so that the commands line up, then the
// command line as it is (a terminal's reader escapes it first).
func WriteDecisionCommands(w io.Writer, indent string, cmds []DecisionCommand) {
	width := 0
	for _, cmd := range cmds {
		width = max(width, len(cmd.Says))
	}
	for _, cmd := range cmds {
		fmt.Fprintf(w, "%s%-*s %s\n", indent, width+1, cmd.Says+":", cmd.Line)
	}
}

var plainWord = regexp.MustCompile(`^[A-Za-z0-9_./:@%+=,-]+$`)

// shellWord is s as one word for a POSIX shell: as it is when nothing in
// it is special, in single quotes otherwise.
func shellWord(s string) string {
	if plainWord.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
