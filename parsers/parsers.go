// Package parsers holds ready-made seams.DecisionParser implementations
// for the two reply shapes agents use most:
//
//   - FencedCode, for code agents: the first fenced code block of a reply
//     is the action (its text runs in the consumer's sandbox); a reply
//     without a block and with a "FINAL ANSWER:" line is the final answer.
//   - ToolCalls, for tool agents: a `TOOL name {json}` line or a JSON
//     object {"tool": "name", "arguments": {...}} is a tool call (the
//     engine validates it against the registry's schema); a `FINAL: text`
//     line or {"final": "text"} is the final answer.
//
// Both cut the history the model sees next turn at the end of the decision
// (what a model writes after its code block or tool call — often an
// imagined result — is dropped), and both answer an unusable reply with an
// InvalidDecision whose explanation tells the model what to write instead.
// Their Parameters name the parser and its settings, so Resume refuses a
// run whose parser changed.
//
// What does not live here: the seam itself (package seams) and the test
// doubles (seams/seamstest's Parser is a test double, not for production).
package parsers

import (
	"encoding/json"
	"strings"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// FencedCode reads a code agent's reply. The zero value is ready: the
// final-answer marker is "FINAL ANSWER:".
type FencedCode struct {
	// FinalPrefix marks a final answer in a reply without a code block
	// (default "FINAL ANSWER:"); the answer is the text after it.
	FinalPrefix string
}

const fence = "```"

func (p FencedCode) final() string {
	if p.FinalPrefix == "" {
		return "FINAL ANSWER:"
	}
	return p.FinalPrefix
}

// Parse implements seams.DecisionParser.
func (p FencedCode) Parse(r events.ModelReply) seams.ParsedReply {
	text := r.Content
	start := strings.Index(text, fence)
	if start < 0 {
		if i := strings.Index(text, p.final()); i >= 0 {
			return seams.ParsedReply{HistoryText: text, Decision: seams.FinalAnswer{Text: strings.TrimSpace(text[i+len(p.final()):])}}
		}
		return seams.ParsedReply{HistoryText: text, Decision: seams.InvalidDecision{
			Explanation: "No code block found. Reply with one fenced code block to run, or " + p.final() + " <answer>."}}
	}
	bodyStart := start + len(fence)
	if nl := strings.IndexByte(text[bodyStart:], '\n'); nl >= 0 {
		bodyStart += nl + 1 // skip the language tag line
	} else {
		bodyStart = len(text)
	}
	end := strings.Index(text[bodyStart:], fence)
	if end < 0 {
		return seams.ParsedReply{HistoryText: text, Decision: seams.InvalidDecision{
			Explanation: "The code block is not closed with ```."}}
	}
	code := text[bodyStart : bodyStart+end]
	if strings.TrimSpace(code) == "" {
		return seams.ParsedReply{HistoryText: text[:bodyStart+end+len(fence)], Decision: seams.InvalidDecision{
			Explanation: "The code block is empty."}}
	}
	return seams.ParsedReply{HistoryText: text[:bodyStart+end+len(fence)], Decision: seams.Action{Text: code}}
}

// Parameters implements seams.DecisionParser.
func (p FencedCode) Parameters() map[string]string {
	return map[string]string{"kind": "fenced-code", "final_prefix": p.final()}
}

// ToolCalls reads a tool agent's reply. The zero value is ready: the
// final-answer line marker is "FINAL:".
type ToolCalls struct {
	// FinalPrefix starts a final-answer line (default "FINAL:").
	FinalPrefix string
}

func (p ToolCalls) final() string {
	if p.FinalPrefix == "" {
		return "FINAL:"
	}
	return p.FinalPrefix
}

// toolCallHelp is what an unusable reply is told.
const toolCallHelp = `Reply with one tool call — a line TOOL <name> {"arg": ...} or a JSON object {"tool": "<name>", "arguments": {...}} — or with a final answer: a line FINAL: <answer> or {"final": "<answer>"}.`

// Parse implements seams.DecisionParser: the first line starting with
// "TOOL " or the final prefix, or the first JSON object, whichever comes
// first, decides.
func (p ToolCalls) Parse(r events.ModelReply) seams.ParsedReply {
	text := r.Content
	lineAt, objAt := -1, strings.IndexByte(text, '{')
	for off := 0; off < len(text); {
		line := text[off:]
		if nl := strings.IndexByte(line, '\n'); nl >= 0 {
			line = line[:nl]
		}
		trimmed := strings.TrimLeft(line, " \t")
		if strings.HasPrefix(trimmed, "TOOL ") || strings.HasPrefix(trimmed, p.final()) {
			lineAt = off + len(line) - len(trimmed)
			break
		}
		off += len(line) + 1
	}
	switch {
	case lineAt >= 0 && (objAt < 0 || lineAt <= objAt):
		return p.line(text, lineAt)
	case objAt >= 0:
		return p.object(text, objAt)
	}
	return seams.ParsedReply{HistoryText: text, Decision: seams.InvalidDecision{Explanation: toolCallHelp}}
}

// line parses a TOOL or final line starting at text[at:].
func (p ToolCalls) line(text string, at int) seams.ParsedReply {
	rest := text[at:]
	if answer, ok := strings.CutPrefix(rest, p.final()); ok {
		return seams.ParsedReply{HistoryText: text, Decision: seams.FinalAnswer{Text: strings.TrimSpace(answer)}}
	}
	rest = strings.TrimPrefix(rest, "TOOL ")
	nameEnd := strings.IndexAny(rest, " \t\n{")
	if nameEnd < 0 {
		nameEnd = len(rest)
	}
	name := rest[:nameEnd]
	if name == "" {
		return seams.ParsedReply{HistoryText: text, Decision: seams.InvalidDecision{
			Explanation: "TOOL needs a tool name before its arguments. " + toolCallHelp}}
	}
	argsAt := at + len("TOOL ") + nameEnd
	args := strings.TrimLeft(text[argsAt:], " \t")
	argsAt = len(text) - len(args)
	if args == "" || args[0] == '\n' {
		// No arguments: an empty object.
		end := argsAt
		return seams.ParsedReply{HistoryText: text[:end], Decision: seams.Action{Text: strings.TrimSpace(text[at:end]),
			ToolCall: &seams.ToolCall{Name: name, Arguments: map[string]any{}}}}
	}
	dec := json.NewDecoder(strings.NewReader(args))
	var m map[string]any
	if err := dec.Decode(&m); err != nil || m == nil {
		return seams.ParsedReply{HistoryText: text, Decision: seams.InvalidDecision{
			Explanation: "The arguments of TOOL " + name + " are not one JSON object" + reason(err) + ". " + toolCallHelp}}
	}
	end := argsAt + int(dec.InputOffset())
	return seams.ParsedReply{HistoryText: text[:end], Decision: seams.Action{Text: text[at:end],
		ToolCall: &seams.ToolCall{Name: name, Arguments: m}}}
}

// object parses a JSON object starting at text[at:].
func (p ToolCalls) object(text string, at int) seams.ParsedReply {
	dec := json.NewDecoder(strings.NewReader(text[at:]))
	var msg struct {
		Tool      string         `json:"tool"`
		Arguments map[string]any `json:"arguments"`
		Final     *string        `json:"final"`
	}
	if err := dec.Decode(&msg); err != nil {
		return seams.ParsedReply{HistoryText: text, Decision: seams.InvalidDecision{
			Explanation: "The JSON object does not parse" + reason(err) + ". " + toolCallHelp}}
	}
	end := at + int(dec.InputOffset())
	history := text[:end]
	switch {
	case msg.Final != nil:
		return seams.ParsedReply{HistoryText: history, Decision: seams.FinalAnswer{Text: *msg.Final}}
	case msg.Tool != "":
		if msg.Arguments == nil {
			msg.Arguments = map[string]any{}
		}
		return seams.ParsedReply{HistoryText: history, Decision: seams.Action{Text: text[at:end],
			ToolCall: &seams.ToolCall{Name: msg.Tool, Arguments: msg.Arguments}}}
	}
	return seams.ParsedReply{HistoryText: history, Decision: seams.InvalidDecision{
		Explanation: `The JSON object has neither "tool" nor "final". ` + toolCallHelp}}
}

func reason(err error) string {
	if err == nil {
		return ""
	}
	return " (" + err.Error() + ")"
}

// Parameters implements seams.DecisionParser.
func (p ToolCalls) Parameters() map[string]string {
	return map[string]string{"kind": "tool-calls", "final_prefix": p.final()}
}
