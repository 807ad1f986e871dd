package parsers_test

import (
	"reflect"
	"testing"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/parsers"
	"github.com/polyloop/polyloop/seams"
)

func reply(s string) events.ModelReply { return events.ModelReply{Content: s} }

// TestFencedCode: the rules of the code agent's parser, one row each.
func TestFencedCode(t *testing.T) {
	cases := []struct {
		name, reply, history string
		want                 seams.Decision
	}{
		{"first block is the action; what follows is cut", "Let me look.\n```sh\nls -la\n```\nOutput: (imagined)\n```sh\nrm -rf /\n```",
			"Let me look.\n```sh\nls -la\n```", seams.Action{Text: "ls -la\n"}},
		{"a block without a language tag", "```\necho hi\n```", "```\necho hi\n```", seams.Action{Text: "echo hi\n"}},
		{"final answer without a block", "Done.\nFINAL ANSWER: 42", "Done.\nFINAL ANSWER: 42", seams.FinalAnswer{Text: "42"}},
		{"a block wins over a final answer line after it", "```sh\nexit 0\n```\nFINAL ANSWER: x", "```sh\nexit 0\n```", seams.Action{Text: "exit 0\n"}},
		{"no block, no answer", "I think so.", "I think so.",
			seams.InvalidDecision{Explanation: "No code block found. Reply with one fenced code block to run, or FINAL ANSWER: <answer>."}},
		{"an unclosed block", "```sh\nls", "```sh\nls", seams.InvalidDecision{Explanation: "The code block is not closed with ```."}},
		{"an empty block", "```sh\n```", "```sh\n```", seams.InvalidDecision{Explanation: "The code block is empty."}},
		{"a blank block keeps its fence in the history", "```\n  \n```\nafter", "```\n  \n```", seams.InvalidDecision{Explanation: "The code block is empty."}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := parsers.FencedCode{}.Parse(reply(c.reply))
			if got.HistoryText != c.history || !reflect.DeepEqual(got.Decision, c.want) {
				t.Fatalf("got %q %#v\nwant %q %#v", got.HistoryText, got.Decision, c.history, c.want)
			}
		})
	}
	if got := (parsers.FencedCode{FinalPrefix: "ANSWER:"}).Parse(reply("ANSWER: 7")).Decision; got != (seams.FinalAnswer{Text: "7"}) {
		t.Fatalf("custom prefix: %#v", got)
	}
}

// TestToolCalls: the rules of the tool agent's parser, one row each.
func TestToolCalls(t *testing.T) {
	call := func(text, name string, args map[string]any) seams.Decision {
		return seams.Action{Text: text, ToolCall: &seams.ToolCall{Name: name, Arguments: args}}
	}
	cases := []struct {
		name, reply, history string
		want                 seams.Decision
	}{
		{"a TOOL line", "I'll read it.\nTOOL read_file {\"path\": \"a.txt\"}\nthen I will...",
			"I'll read it.\nTOOL read_file {\"path\": \"a.txt\"}", call(`TOOL read_file {"path": "a.txt"}`, "read_file", map[string]any{"path": "a.txt"})},
		{"a TOOL line without arguments", "TOOL list\nmore", "TOOL list", call("TOOL list", "list", map[string]any{})},
		{"a TOOL line after a blank line", "Let me see.\n\nTOOL list {}", "Let me see.\n\nTOOL list {}", call("TOOL list {}", "list", map[string]any{})},
		{"an indented TOOL line", "  TOOL list {}", "  TOOL list {}", call("TOOL list {}", "list", map[string]any{})},
		{"a JSON object after prose", `Sure: {"tool": "count", "arguments": {"dir": "d"}} and then`,
			`Sure: {"tool": "count", "arguments": {"dir": "d"}}`, call(`{"tool": "count", "arguments": {"dir": "d"}}`, "count", map[string]any{"dir": "d"})},
		{"a JSON object without arguments", `{"tool": "list"}`, `{"tool": "list"}`, call(`{"tool": "list"}`, "list", map[string]any{})},
		{"a FINAL line", "All done.\nFINAL: the answer is 4", "All done.\nFINAL: the answer is 4", seams.FinalAnswer{Text: "the answer is 4"}},
		{"a JSON final answer", `{"final": "4"}`, `{"final": "4"}`, seams.FinalAnswer{Text: "4"}},
		{"the earlier of line and object decides", "{\"final\": \"no\"}\nTOOL list {}", `{"final": "no"}`, seams.FinalAnswer{Text: "no"}},
		{"TOOL arguments that are not an object", "TOOL pay [1, 2]", "TOOL pay [1, 2]", seams.InvalidDecision{
			Explanation: "The arguments of TOOL pay are not one JSON object (json: cannot unmarshal array into Go value of type map[string]interface {}). " + toolHelp}},
		{"TOOL arguments that are null", "TOOL search null", "TOOL search null", seams.InvalidDecision{
			Explanation: "The arguments of TOOL search are not one JSON object. " + toolHelp}},
		{"a TOOL line without a name", `TOOL {"a": 1}`, `TOOL {"a": 1}`, seams.InvalidDecision{
			Explanation: "TOOL needs a tool name before its arguments. " + toolHelp}},
		{"an object that does not parse", `{"tool": "x", `, `{"tool": "x", `, seams.InvalidDecision{
			Explanation: "The JSON object does not parse (unexpected EOF). " + toolHelp}},
		{"an object with neither key", `{"thought": "hm"}`, `{"thought": "hm"}`, seams.InvalidDecision{
			Explanation: `The JSON object has neither "tool" nor "final". ` + toolHelp}},
		{"prose only", "let me think", "let me think", seams.InvalidDecision{Explanation: toolHelp}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := parsers.ToolCalls{}.Parse(reply(c.reply))
			if got.HistoryText != c.history || !reflect.DeepEqual(got.Decision, c.want) {
				t.Fatalf("got %q %#v\nwant %q %#v", got.HistoryText, got.Decision, c.history, c.want)
			}
		})
	}
}

const toolHelp = `Reply with one tool call — a line TOOL <name> {"arg": ...} or a JSON object {"tool": "<name>", "arguments": {...}} — or with a final answer: a line FINAL: <answer> or {"final": "<answer>"}.`

// TestParametersNameTheSettings: a changed prefix is a changed parser, so
// Resume refuses a run whose parser changed.
func TestParametersNameTheSettings(t *testing.T) {
	if reflect.DeepEqual(parsers.ToolCalls{}.Parameters(), parsers.ToolCalls{FinalPrefix: "DONE:"}.Parameters()) {
		t.Fatal("ToolCalls parameters ignore the prefix")
	}
	if reflect.DeepEqual(parsers.FencedCode{}.Parameters(), parsers.FencedCode{FinalPrefix: "DONE:"}.Parameters()) {
		t.Fatal("FencedCode parameters ignore the prefix")
	}
}
