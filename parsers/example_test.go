package parsers_test

import (
	"fmt"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/parsers"
	"github.com/polyloop/polyloop/seams"
)

// describe prints a parser's reading of a reply: the decision, and the
// history text the model sees next turn.
func describe(p seams.DecisionParser, content string) {
	parsed := p.Parse(events.ModelReply{Content: content})
	switch d := parsed.Decision.(type) {
	case seams.Action:
		if d.ToolCall != nil {
			fmt.Printf("tool call %s %v\n", d.ToolCall.Name, d.ToolCall.Arguments)
		} else {
			fmt.Printf("action %q\n", d.Text)
		}
	case seams.FinalAnswer:
		fmt.Printf("final answer %q\n", d.Text)
	case seams.InvalidDecision:
		fmt.Printf("invalid: %s\n", d.Explanation)
	}
	fmt.Printf("  history: %q\n", parsed.HistoryText)
}

// A tool agent's replies: a TOOL line (what the model imagines after it is
// cut from the history), a JSON object, a final answer, and a reply that
// is none of these, whose explanation goes back to the model.
func ExampleToolCalls() {
	p := parsers.ToolCalls{}
	describe(p, "I need the population.\nTOOL lookup {\"city\": \"Paris\"}\nObservation: 2.1 million")
	describe(p, `{"tool": "submit", "arguments": {"answer": "2.1 million"}}`)
	describe(p, "FINAL: 2.1 million people")
	describe(p, "Let me think about it.")
	fmt.Println(p.Parameters())
	// Output:
	// tool call lookup map[city:Paris]
	//   history: "I need the population.\nTOOL lookup {\"city\": \"Paris\"}"
	// tool call submit map[answer:2.1 million]
	//   history: "{\"tool\": \"submit\", \"arguments\": {\"answer\": \"2.1 million\"}}"
	// final answer "2.1 million people"
	//   history: "FINAL: 2.1 million people"
	// invalid: Reply with one tool call — a line TOOL <name> {"arg": ...} or a JSON object {"tool": "<name>", "arguments": {...}} — or with a final answer: a line FINAL: <answer> or {"final": "<answer>"}.
	//   history: "Let me think about it."
	// map[final_prefix:FINAL: kind:tool-calls]
}

// A code agent's replies: the first fenced code block is the action, a
// FINAL ANSWER line without a block is the final answer.
func ExampleFencedCode() {
	p := parsers.FencedCode{}
	describe(p, "Count the files.\n```bash\nls | wc -l\n```\nIt will print 3.")
	describe(p, "FINAL ANSWER: 3")
	describe(p, "There are probably 3 files.")
	fmt.Println(p.Parameters())
	// Output:
	// action "ls | wc -l\n"
	//   history: "Count the files.\n```bash\nls | wc -l\n```"
	// final answer "3"
	//   history: "FINAL ANSWER: 3"
	// invalid: No code block found. Reply with one fenced code block to run, or FINAL ANSWER: <answer>.
	//   history: "There are probably 3 files."
	// map[final_prefix:FINAL ANSWER: kind:fenced-code]
}
