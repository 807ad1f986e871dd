package engine

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

var update = flag.Bool("update", false, "rewrite the golden transcripts")

// TestTranscripts drives the pure machine with the scripts in
// testdata/transcripts/*.script and compares the commands it returns with
// the .golden files beside them (rewrite with go test -update).
//
// A script sets the run up, then lists what the outside world does, in order:
//
//	budget steps=N actions=N parse=N prompt=N
//	model_policy safe|never
//	tools                    use the test registry (count: safe, pay: never, submit: completes_run)
//	start_interrupted        Definition.Interrupt is closed before the run begins (engine.Start)
//	model <content>          the model replies (call id c<N>)
//	model~ <content>         the model replies without a call id
//	thinking <text>          the next reply carries this thinking
//	model! <error>           the model call fails
//	action <observation>     the action runs; "action+ <obs>" also reports completion
//	action~N <observation>   the action runs; N characters were cut from its observation
//	action? <status>         the executor returns an outcome with this (invalid) status
//	action! <error>          the executor fails
//	cancel                   the context is cancelled from now on
//	interrupt                Definition.Interrupt is closed from now on
//	resume                   (after the machine stopped interrupted) a new machine replays
//	                         the durable log and begins, not interrupted
//	crash                    the process dies; a new machine replays what was durable, then begins
//	crash N                  (right after a line that leads to an append) only the first N
//	                         events of that append became durable, then the process died
//	approval_tools           (setup) tools, and refund: never, requires approval, amount ≤ 500
//	approve_pay_over N       (setup) an approval policy: pay calls over N need approval
//	await_resolution         (setup) Request.AwaitResolution
//	approve BY [JSON]        while the run waits (or its process is gone) a person's decision is
//	reject BY [NOTE]         made durable after the log's tail; a new machine replays and begins
//	executed BY OBSERVATION  an operator's finding on the action in doubt, likewise
//	not_executed BY
//
// Every append command is answered as durable at once. A .golden file reads
// as the conversation: "> input", then "< command".
func TestTranscripts(t *testing.T) {
	scripts, _ := filepath.Glob("testdata/transcripts/*.script")
	if len(scripts) < 10 {
		t.Fatalf("found %d scripts, want one per stop reason at least", len(scripts))
	}
	for _, path := range scripts {
		name := strings.TrimSuffix(filepath.Base(path), ".script")
		t.Run(name, func(t *testing.T) {
			got := runScript(t, path)
			golden := strings.TrimSuffix(path, ".script") + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update)", err)
			}
			if got != string(want) {
				t.Errorf("transcript changed; got:\n%s", got)
			}
		})
	}
}

type scriptRun struct {
	t       *testing.T
	out     strings.Builder
	cfg     *config
	m       *machine
	durable []events.Envelope
	ids     int
	clock   time.Time
	cancel  bool
	stop    bool // interrupted
}

func runScript(t *testing.T, path string) string {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var setup, steps []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		switch strings.Fields(line)[0] {
		case "budget", "model_policy", "tools", "start_interrupted", "approval_tools", "approve_pay_over", "await_resolution":
			setup = append(setup, line)
		default:
			steps = append(steps, line)
		}
	}
	r := &scriptRun{t: t, clock: time.UnixMilli(1_767_225_600_000)}
	r.cfg = r.configure(setup)
	r.m = newMachine(r.cfg)
	r.stop = slices.Contains(setup, "start_interrupted")
	cmd := r.feed(input{kind: inBegin}, "begin")
	thinking := ""
	var usage *events.Usage
	for {
		switch cmd.kind {
		case cmdAppend:
			if len(steps) > 0 && strings.HasPrefix(steps[0], "crash ") {
				n, err := strconv.Atoi(strings.TrimPrefix(steps[0], "crash "))
				if err != nil || n < 0 || n >= len(cmd.events) {
					t.Fatalf("%q: want crash N with N below the append's %d events", steps[0], len(cmd.events))
				}
				steps = steps[1:]
				r.persist(cmd.events[:n])
				cmd = r.crash(fmt.Sprintf("# crash after %d of %d events were durable; a new machine replays the log\n", n, len(cmd.events)))
				continue
			}
			cmd = r.feed(input{kind: inAppended, envs: r.persist(cmd.events)}, "appended")
			continue
		case cmdDone:
			return r.out.String()
		case cmdInterrupted:
			if len(steps) == 0 {
				return r.out.String()
			}
			if steps[0] != "resume" {
				t.Fatalf("%q after the machine stopped interrupted: want resume", steps[0])
			}
			steps = steps[1:]
			r.stop = false
			cmd = r.crash("# stopped at a step boundary; a new machine replays the log and resumes\n")
			continue
		case cmdFail:
			t.Fatalf("machine failed: %s", cmd.err)
		case cmdAwait:
			if len(steps) == 0 {
				return r.out.String()
			}
		}
		if len(steps) == 0 {
			t.Fatalf("script ended while the machine waits for %s", renderCommand(cmd))
		}
		line := steps[0]
		steps = steps[1:]
		verb, arg, _ := strings.Cut(line, " ")
		switch {
		case verb == "thinking":
			thinking = arg
			continue
		case verb == "usage": // "usage IN OUT": the next reply's token counts
			var in, out int64
			if _, err := fmt.Sscan(arg, &in, &out); err != nil {
				t.Fatalf("%q: want usage IN OUT", line)
			}
			usage = &events.Usage{InputTokens: &in, OutputTokens: &out}
			continue
		case strings.HasPrefix(verb, "action~"):
			n, err := strconv.Atoi(strings.TrimPrefix(verb, "action~"))
			if err != nil {
				t.Fatalf("%q: want action~N", line)
			}
			cmd = r.feed(input{kind: inActionReturned, outcome: events.ActionOutcome{Status: events.StatusExecuted, Observation: arg, ObservationTruncatedChars: n}}, line)
			continue
		}
		switch verb {
		case "cancel":
			r.cancel = true
			r.out.WriteString("# context cancelled\n")
			continue // the pending side effect is still pending
		case "interrupt":
			r.stop = true
			r.out.WriteString("# interrupted (a worker shuts down)\n")
			continue
		case "crash":
			cmd = r.crash("# crash: a new machine replays the durable log\n")
			continue
		case "approve", "reject", "executed", "not_executed":
			cmd = r.decide(events.Verdict(verb), arg)
			continue
		case "model", "model~":
			reply := events.ModelReply{CallID: fmt.Sprintf("c%d", cmd.model.CallIndex), Content: arg, Thinking: thinking, Usage: usage}
			if verb == "model~" {
				reply.CallID = ""
			}
			thinking, usage = "", nil
			cmd = r.feed(input{kind: inModelReturned, reply: reply}, line)
		case "model!":
			cmd = r.feed(input{kind: inModelReturned, err: errors.New(arg)}, line)
		case "action", "action+":
			cmd = r.feed(input{kind: inActionReturned, outcome: events.ActionOutcome{Status: events.StatusExecuted, Observation: arg, EnvReportedCompletion: verb == "action+"}}, line)
		case "action!":
			cmd = r.feed(input{kind: inActionReturned, err: errors.New(arg)}, line)
		case "action?":
			cmd = r.feed(input{kind: inActionReturned, outcome: events.ActionOutcome{Status: events.ActionStatus(arg), Observation: "whatever"}}, line)
		default:
			t.Fatalf("unknown script line %q", line)
		}
	}
}

func (r *scriptRun) configure(setup []string) *config {
	req := Request{RunID: "t", Budget: Budget{MaxSteps: 10, MaxActions: 10, MaxConsecutiveParseFailures: 2, MaxPromptChars: 10_000},
		Executor: &seamstest.Executor{}, ModelReplayPolicy: events.ReplaySafe, ObservationTemplate: "Obs: {observation}",
		Context: Context{RunLevel: []seams.Message{seams.Text(seams.RoleSystem, "sys")}, GoalLevel: []seams.Message{seams.Text(seams.RoleUser, "goal")}}}
	for _, line := range setup {
		f := strings.Fields(line)
		switch f[0] {
		case "budget":
			for _, kv := range f[1:] {
				k, v, _ := strings.Cut(kv, "=")
				n, _ := strconv.Atoi(v)
				switch k {
				case "steps":
					req.Budget.MaxSteps = n
				case "actions":
					req.Budget.MaxActions = n
				case "parse":
					req.Budget.MaxConsecutiveParseFailures = n
				case "prompt":
					req.Budget.MaxPromptChars = n
				case "tokens":
					req.Budget.MaxTotalTokens = int64(n)
				}
			}
		case "model_policy":
			req.ModelReplayPolicy = events.ReplayPolicy(f[1])
		case "approval_tools":
			handler := func(context.Context, map[string]any) (string, error) { return "", nil }
			reg, err := seams.NewRegistry(
				seams.Tool{Spec: seams.ToolSpec{Name: "count", ReplayPolicy: events.ReplaySafe}, Handler: handler},
				seams.Tool{Spec: seams.ToolSpec{Name: "pay", Parameters: map[string]any{"type": "object", "required": []string{"amount"}}}, Handler: handler},
				seams.Tool{Spec: seams.ToolSpec{Name: "refund", RequiresApproval: true, Parameters: map[string]any{"type": "object",
					"properties": map[string]any{"amount": map[string]any{"type": "number", "maximum": 500}}, "required": []string{"amount"}}}, Handler: handler},
			)
			if err != nil {
				r.t.Fatal(err)
			}
			req.Tools, req.Executor = reg, reg.Executor()
			req.ToolSectionTemplate = "Tools: {tools}"
		case "approve_pay_over":
			n, _ := strconv.ParseFloat(f[1], 64)
			req.Approval = payOver(n)
		case "await_resolution":
			req.AwaitResolution = true
		case "tools":
			reg, err := seams.NewRegistry(
				seams.Tool{Spec: seams.ToolSpec{Name: "count", ReplayPolicy: events.ReplaySafe}, Handler: func(context.Context, map[string]any) (string, error) { return "", nil }},
				seams.Tool{Spec: seams.ToolSpec{Name: "pay", Parameters: map[string]any{"type": "object", "required": []string{"amount"}}},
					Handler: func(context.Context, map[string]any) (string, error) { return "", nil }},
				seams.Tool{Spec: seams.ToolSpec{Name: "submit", CompletesRun: true}, Handler: func(context.Context, map[string]any) (string, error) { return "", nil }},
			)
			if err != nil {
				r.t.Fatal(err)
			}
			req.Tools, req.Executor = reg, reg.Executor()
			req.ToolSectionTemplate = "Tools: {tools}"
		}
	}
	cfg, err := prepare(Definition{Model: &seamstest.Model{}, Parser: seamstest.Parser{}, Store: &seamstest.MemStore{}}, req)
	if err != nil {
		r.t.Fatal(err)
	}
	return cfg
}

// payOver is an approval policy: pay calls whose amount is over it need a
// person's approval.
type payOver float64

func (p payOver) RequiresApproval(a seams.Action) bool {
	tc := a.ToolCall
	if tc == nil || tc.Name != "pay" {
		return false
	}
	amount, _ := tc.Arguments["amount"].(float64)
	return amount > float64(p)
}

func (p payOver) Parameters() map[string]string {
	return map[string]string{"pay_over": strconv.FormatFloat(float64(p), 'f', -1, 64)}
}

// decide makes a person's decision durable after the log's tail — the
// machine that waited (or the process that died) is gone — and a new
// machine replays the log and begins, as Decide then Resume do. arg is
// "BY [JSON arguments | note | observation]".
func (r *scriptRun) decide(verdict events.Verdict, arg string) command {
	by, rest, _ := strings.Cut(arg, " ")
	cur := r.m.fold().Current
	if cur.Action == nil {
		r.t.Fatalf("%s: no action to decide on", verdict)
	}
	d := events.Decision{RunID: r.cfg.runID, ResultID: cur.Action.ResultID, Verdict: verdict, By: by}
	switch verdict {
	case "approve":
		d.Verdict = events.VerdictApproved
		if rest != "" {
			d.Arguments = &rest
		}
	case "reject":
		d.Verdict, d.Note = events.VerdictRejected, rest
	case events.VerdictExecuted:
		d.Observation = &rest
	}
	r.clock = r.clock.Add(time.Minute) // a person takes a while
	r.persist([]events.Event{d})
	return r.crash(fmt.Sprintf("# %s: %s\n", by, renderEvent(d)))
}

// crash drops the machine, replays what is durable into a new one and
// begins it, as Resume does.
func (r *scriptRun) crash(note string) command {
	r.out.WriteString(note)
	r.m = newMachine(r.cfg)
	for _, env := range r.durable {
		r.m.step(input{kind: inReplayed, env: env})
	}
	return r.feed(input{kind: inBegin}, "begin (resume)")
}

// feed observes like a driver (a fixed clock advancing 5 ms per input, ids
// id1, id2, ...) and records the exchange.
func (r *scriptRun) feed(in input, label string) command {
	r.clock = r.clock.Add(5 * time.Millisecond)
	r.ids++
	in.at, in.freshID, in.cancelled, in.interrupted = r.clock, fmt.Sprintf("id%d", r.ids), r.cancel, r.stop
	cmd := r.m.step(in)
	fmt.Fprintf(&r.out, "> %s\n< %s\n", label, renderCommand(cmd))
	return cmd
}

// persist stamps the events like a store would.
func (r *scriptRun) persist(evs []events.Event) []events.Envelope {
	var out []events.Envelope
	for _, ev := range evs {
		var id ulid.ULID
		_ = id.SetTime(ulid.Timestamp(r.clock))
		id[15] = byte(len(r.durable))
		env := events.Envelope{ID: id, Kind: ev.Kind(), SchemaVersion: events.CurrentSchemaVersion, Event: ev}
		r.durable = append(r.durable, env)
		out = append(out, env)
	}
	return out
}

func renderCommand(c command) string {
	switch c.kind {
	case cmdNone:
		return "nothing"
	case cmdAppend:
		var parts []string
		for _, ev := range c.events {
			parts = append(parts, renderEvent(ev))
		}
		return "append " + strings.Join(parts, "\n         + ")
	case cmdCallModel:
		var roles []string
		for _, m := range c.model.Messages {
			roles = append(roles, string(m.Role[0]))
		}
		return fmt.Sprintf("call model #%d result=%s messages=%s", c.model.CallIndex, c.model.ResultID, strings.Join(roles, ""))
	case cmdExecute:
		tool := ""
		if tc := c.action.Action.ToolCall; tc != nil {
			tool = " tool=" + tc.Name + " arguments=" + toolArguments(tc)
		}
		return fmt.Sprintf("execute step=%d result=%s%s %q", c.action.StepIdx, c.action.ResultID, tool, c.action.Action.Text)
	case cmdDone:
		answer := ""
		if c.result.FinalAnswer != nil {
			answer = fmt.Sprintf(" answer=%q", *c.result.FinalAnswer)
		}
		return fmt.Sprintf("done %s steps=%d%s", c.result.StopReason, len(c.result.Steps), answer)
	case cmdInterrupted:
		return "stop interrupted (unfinished)"
	case cmdAwait:
		p := c.pending
		return fmt.Sprintf("await %s call=%s step=%d tool=%s arguments=%s since=%s", p.Awaits, p.Call, p.Step, p.Tool, p.Arguments,
			p.Since.UTC().Format("15:04:05.000"))
	}
	return "fail " + c.err
}

func renderEvent(ev events.Event) string {
	str := func(p *string) string {
		if p == nil {
			return "null"
		}
		return strconv.Quote(*p)
	}
	switch e := ev.(type) {
	case events.RunStarted:
		return fmt.Sprintf("run_started(%d parameters)", len(e.ParameterSnapshot))
	case events.Intent:
		tool := ""
		if e.ToolName != "" {
			tool = " tool=" + e.ToolName
		}
		if e.Awaits != "" {
			tool += fmt.Sprintf(" awaits=%s arguments=%s schema=%s", e.Awaits, e.Arguments, e.ArgumentsSchema)
		}
		return fmt.Sprintf("intent(%s #%d %s %s%s)", e.IntentKind, e.CallIndex, e.ResultID, e.ReplayPolicy, tool)
	case events.Decision:
		return fmt.Sprintf("decision(%s %s by=%s note=%q arguments=%s observation=%s)", e.ResultID, e.Verdict, e.By, e.Note,
			str(e.Arguments), str(e.Observation))
	case events.ModelCallResult:
		if e.Failure != nil {
			return fmt.Sprintf("model_call_result(%s failure=%q)", e.ResultID, *e.Failure)
		}
		if u := e.Reply.Usage; u != nil && u.InputTokens != nil && u.OutputTokens != nil {
			return fmt.Sprintf("model_call_result(%s reply=%q tokens=%d+%d)", e.ResultID, e.Reply.Content, *u.InputTokens, *u.OutputTokens)
		}
		return fmt.Sprintf("model_call_result(%s reply=%q)", e.ResultID, e.Reply.Content)
	case events.StepCompleted:
		s := e.Step
		outcome := "none"
		if o := e.ActionOutcome; o != nil {
			outcome = string(o.Status)
			if o.EnvError != nil {
				outcome += fmt.Sprintf(" env_error=%q", *o.EnvError)
			}
		}
		status := "null"
		if s.ActionStatus != nil {
			status = string(*s.ActionStatus)
		}
		// Every StepRecord field, in the record's order.
		return fmt.Sprintf("step_completed(result=%q outcome=%s\n"+
			"             step_idx=%d raw_output=%q content_chars=%d thinking_chars=%d action=%s parse_ok=%v parse_error=%s\n"+
			"             observation=%q observation_is_synthetic=%v observation_truncated_chars=%d prompt_chars=%d call_id=%s step_wall_ms=%d\n"+
			"             tool_name=%s tool_arguments=%s action_status=%s env_reported_completion=%v schema_version=%s)",
			e.ResultID, outcome,
			s.StepIdx, s.RawOutput, s.ContentChars, s.ThinkingChars, str(s.Action), s.ParseOK, str(s.ParseError),
			s.Observation, s.ObservationIsSynthetic, s.ObservationTruncatedChars, s.PromptChars, str(s.CallID), s.StepWallMs,
			str(s.ToolName), str(s.ToolArguments), status, s.EnvReportedCompletion, s.SchemaVersion)
	case events.RunFinished:
		return fmt.Sprintf("run_finished(%s answer=%s)", e.Result.StopReason, str(e.Result.FinalAnswer))
	}
	return fmt.Sprintf("%T", ev)
}
