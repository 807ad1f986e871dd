package engine

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
)

// The machine is the run loop as a pure reducer, in the manner of etcd's
// raft: step takes an input and returns the one command the driver must
// carry out next. It reads no clock, mints no ids, holds no context and does
// no I/O: the driver observes the time, a fresh id and whether the run was
// cancelled, and passes them in with every input.
//
// Its state is a fold of the run's durable events. When it plans a batch of
// events it applies them at once (apply is the only transition), so the
// rest of the batch is planned from the state the batch leads to; if the
// append fails the driver abandons the machine, and Resume rebuilds one from
// what is durable. Replay feeds stored events through the same apply.

// inputKind says what happened.
type inputKind int

const (
	inBegin          inputKind = iota // start the run, or continue it after replay
	inReplayed                        // a stored event (Resume)
	inAppended                        // the last append command is durable
	inModelReturned                   // the model call returned or failed
	inActionReturned                  // the action returned or failed
)

// input is what the driver tells the machine.
type input struct {
	kind inputKind
	// observed by the driver for every input
	at        time.Time
	freshID   string // unused id the machine may give one intent
	cancelled bool
	// interrupted: stop at the next step boundary (Definition.Interrupt)
	interrupted bool
	failures    int // sink delivery failures so far
	// per kind
	env     events.Envelope   // inReplayed
	envs    []events.Envelope // inAppended
	reply   events.ModelReply // inModelReturned
	outcome events.ActionOutcome
	err     error // inModelReturned, inActionReturned
}

// cmdKind says what the driver must do next.
type cmdKind int

const (
	cmdNone        cmdKind = iota // nothing (after a replayed event)
	cmdAppend                     // make events durable, in order, then report inAppended
	cmdCallModel                  // call the model, then report inModelReturned
	cmdExecute                    // execute the action, then report inActionReturned
	cmdDone                       // the run is over; return result
	cmdInterrupted                // the run stopped at a step boundary, unfinished
	cmdAwait                      // the run waits for a person's decision on pending
	cmdFail                       // the machine was driven wrongly (a bug)
)

// command is the machine's answer. Ordering rule: the events of a cmdAppend
// must be durable before the driver reports inAppended, and the machine only
// asks for a side effect (cmdCallModel, cmdExecute) once the intent for it
// has been reported durable.
type command struct {
	kind    cmdKind
	events  []events.Event
	model   seams.ModelCall
	action  seams.ActionCall
	result  events.RunResult
	pending *recovery.PendingCall
	err     string
}

// config is a run's fixed inputs, prepared once.
type config struct {
	runID       string
	budget      Budget
	modelPolicy events.ReplayPolicy
	obsTemplate string
	synthetic   SyntheticObservations
	parser      seams.DecisionParser
	tools       *seams.Registry
	binding     map[string]string
	snapshot    map[string]string
	approval    seams.ApprovalPolicy // nil: only tools whose spec says so need approval
	agent       string               // the request's Agent and Input, recorded in RunStarted
	input       []byte
	prefix      []seams.Message // run-level, injections, tool section, goal-level
	prefixChars int
}

// current is what the machine notes of the step in progress beside the
// fold's record of it (recovery.Step).
type current struct {
	intentAt time.Time // when the model intent became durable: the step's start
	issued   bool      // model intent written by this machine, not replayed
	parsed   *seams.ParsedReply
	args     string    // the parsed tool call's arguments as JSON text (toolArguments)
	acted    bool      // action intent written by this machine
	actionAt time.Time // when the latest action intent became durable
}

// ending is a stop decided by a completed step.
type ending struct {
	reason events.StopReason
	answer *string
}

type machine struct {
	cfg *config
	// log is the run's log: its fold (recovery.Fold) is the machine's
	// state of the run, and while the machine replays a stored stream it
	// checks each event too. diff lists the parameters the stored snapshot
	// does not share with the run's (set when replaying RunStarted).
	log  *recovery.Classifier
	diff []string

	actions       int // executed actions
	parseFailures int // consecutive
	// prompt is the prefix followed by the history, grown in place; a model
	// call gets a capacity-capped view of it, so a step costs O(1) here
	// however long the history is.
	prompt       []seams.Message
	historyChars int
	cur          current
	// ending is how the run must stop after the last completed step (a
	// final answer, a failed model call, env_error, completion, too many
	// parse failures), derived from the durable step so that a crash
	// between StepCompleted and RunFinished resumes to the same stop.
	ending *ending
	// interrupted: the run stops at this step boundary (input.interrupted)
	interrupted bool

	batch []events.Event // being planned
}

func newMachine(cfg *config) *machine {
	return &machine{cfg: cfg, log: recovery.NewClassifier(cfg.runID), prompt: append([]seams.Message(nil), cfg.prefix...)}
}

// fold is the run's log as the machine knows it.
func (m *machine) fold() *recovery.Fold { return m.log.Fold() }

// step is the reducer.
func (m *machine) step(in input) command {
	switch in.kind {
	case inReplayed:
		m.replay(in.env)
		return command{kind: cmdNone}
	case inBegin:
		if !m.fold().Started {
			m.emit(events.RunStarted{RunID: m.cfg.runID, ParameterSnapshot: m.cfg.snapshot, SchemaVersion: events.CurrentSchemaVersion,
				Agent: m.cfg.agent, Input: m.cfg.input})
			m.startStep(in)
			return m.flush()
		}
		return m.continueTail(in)
	case inAppended:
		for _, env := range in.envs {
			if in, ok := env.Event.(events.Intent); ok && m.fold().Current.Model != nil && in.ResultID == m.fold().Current.Model.ResultID {
				m.cur.intentAt = env.Time()
			} else if ok && in.IntentKind == events.IntentAction {
				m.cur.actionAt = env.Time()
			}
		}
		return m.afterDurable(in)
	case inModelReturned:
		return m.modelReturned(in)
	case inActionReturned:
		return m.actionReturned(in)
	}
	return command{kind: cmdFail, err: fmt.Sprintf("unknown input %d", in.kind)}
}

// emit plans an event: it joins the batch and the state moves past it.
func (m *machine) emit(ev events.Event) {
	m.batch = append(m.batch, ev)
	m.apply(ev, time.Time{}, true)
}

func (m *machine) flush() command {
	if len(m.batch) == 0 && m.interrupted {
		return command{kind: cmdInterrupted}
	}
	c := command{kind: cmdAppend, events: m.batch}
	m.batch = nil
	return c
}

// apply is the machine's only state transition: the fold of one durable
// (or planned) event, and the machine's notes on it. live says the machine
// itself wrote it.
func (m *machine) apply(ev events.Event, at time.Time, live bool) {
	m.note(ev, at, live)
	m.fold().Apply(ev)
}

// replay folds a stored event through the log's checks (Resume). The
// machine notes it only while the log is sound and the run's parameters
// are the stored ones: Resume refuses the run otherwise, and the notes of
// what it refuses would be wasted.
func (m *machine) replay(env events.Envelope) {
	if m.log.Sound() && len(m.diff) == 0 && env.Kind != events.KindRunFinished {
		m.note(env.Event, env.Time(), false)
	}
	m.log.Apply(env)
	if started, ok := env.Event.(events.RunStarted); ok && m.log.Events() == 1 {
		m.diff = append(snapshotDiff(started.ParameterSnapshot, m.cfg.snapshot), startedDiff(started, Request{Agent: m.cfg.agent, Input: m.cfg.input})...)
	}
}

// note is what the machine keeps of an event beside the fold, taken before
// the fold moves past it (a completed step's ending reads the step in
// progress).
func (m *machine) note(ev events.Event, at time.Time, live bool) {
	switch ev := ev.(type) {
	case events.Intent:
		if ev.IntentKind == events.IntentModelCall {
			m.cur = current{intentAt: at, issued: live}
		} else {
			m.cur.acted, m.cur.actionAt = live, at
		}
	case events.StepCompleted:
		s := ev.Step
		if ev.ActionOutcome != nil && ev.ActionOutcome.Status == events.StatusExecuted {
			m.actions++
		}
		if s.ParseOK {
			m.parseFailures = 0
		} else if s.ParseError != nil {
			m.parseFailures++
		}
		m.ending = m.stepEnding(ev)
		m.addHistory(seams.Text(seams.RoleAssistant, s.RawOutput), seams.Text(seams.RoleUser, s.Observation))
		m.cur = current{}
	}
}

// done is the command that ends a finished run with its result.
func (m *machine) done() command {
	r, _ := m.fold().Result()
	return command{kind: cmdDone, result: r}
}

func (m *machine) addHistory(msgs ...seams.Message) {
	for _, msg := range msgs {
		m.prompt = append(m.prompt, msg)
		m.historyChars += messageChars(msg)
	}
}

// promptChars is the size, in code points, of the prompt of the step in
// progress (history changes only when a step completes).
func (m *machine) promptChars() int { return m.cfg.prefixChars + m.historyChars }

// afterDurable: the planned batch is durable; ask for the side effect it
// announced, or end the run. A run cancelled meanwhile starts no side
// effect: it finishes cancelled, leaving the intent unanswered (the side
// effect was never started; recovery accepts an unanswered intent before
// RunFinished{cancelled}).
func (m *machine) afterDurable(in input) command {
	cur := &m.fold().Current
	switch {
	case m.fold().Finished != nil:
		return m.done()
	case in.cancelled && (m.cur.acted || m.cur.issued):
		m.finish(in, events.StopCancelled, nil)
		return m.flush()
	case cur.Action != nil && m.cur.acted && cur.Action.Awaits != "":
		return m.awaitCommand()
	case cur.Action != nil && m.cur.acted:
		return m.executeCommand()
	case cur.Model != nil && m.cur.issued && cur.Reply == nil && cur.Failure == nil:
		return m.modelCommand()
	case m.interrupted && in.cancelled:
		// A cancellation seen at the boundary (an operator's request the
		// append brought back) ends the run: a stopping worker does not
		// hand back a run its operator asked to end.
		m.finish(in, events.StopCancelled, nil)
		return m.flush()
	case m.interrupted:
		return command{kind: cmdInterrupted}
	}
	return command{kind: cmdFail, err: "append reported with no side effect or finish pending"}
}

// stepEnding is the stop a completed step calls for, if any: the stop
// checks after a step, in order: a failed model call, a failed environment,
// a completing action, a final answer, the parse-failure limit (the budgets
// are checked before the next step). It reads the step in progress, so it
// runs before apply resets it.
func (m *machine) stepEnding(ev events.StepCompleted) *ending {
	out, cur := ev.ActionOutcome, &m.fold().Current
	switch {
	case cur.Failure != nil:
		return &ending{reason: events.StopLLMError}
	case out != nil && out.Status == events.StatusEnvError:
		return &ending{reason: events.StopEnvError}
	case out != nil && out.Status == events.StatusExecuted && (out.EnvReportedCompletion || m.completesRun(ev.Step.ToolName)):
		return &ending{reason: events.StopTaskCompleted}
	case out == nil && ev.Step.ParseOK && cur.Reply != nil:
		if fa, ok := m.parsed().Decision.(seams.FinalAnswer); ok {
			answer := fa.Text
			return &ending{reason: events.StopAgentFinished, answer: &answer}
		}
	case m.parseFailures >= m.cfg.budget.MaxConsecutiveParseFailures:
		return &ending{reason: events.StopParseFailedRepeatedly}
	}
	return nil
}

func (m *machine) completesRun(tool *string) bool {
	if tool == nil || m.cfg.tools == nil {
		return false
	}
	spec, ok := m.cfg.tools.SpecFor(*tool)
	return ok && spec.CompletesRun
}

// startStep plans the start of the next step: the stop the last step called
// for, the stop checks, prompt size, and the model intent.
func (m *machine) startStep(in input) {
	b := m.cfg.budget
	switch {
	case m.ending != nil:
		m.finish(in, m.ending.reason, m.ending.answer)
	case in.cancelled:
		m.finish(in, events.StopCancelled, nil)
	case len(m.fold().Steps) >= b.MaxSteps:
		m.finish(in, events.StopStepBudget, nil)
	case m.actions >= b.MaxActions:
		m.finish(in, events.StopActionBudget, nil)
	case b.MaxTotalTokens > 0 && m.fold().Usage.Total() >= b.MaxTotalTokens:
		m.finish(in, events.StopTokenBudget, nil)
	case m.promptChars() > b.MaxPromptChars:
		m.finish(in, events.StopContextOverflow, nil)
	case in.interrupted:
		// A step boundary, nothing in doubt: the run stops unfinished
		// once what is planned is durable, announcing no model call.
		m.interrupted = true
	default:
		m.emit(events.Intent{RunID: m.cfg.runID, IntentKind: events.IntentModelCall, CallIndex: len(m.fold().Steps),
			ResultID: in.freshID, ReplayPolicy: m.cfg.modelPolicy})
	}
}

func (m *machine) finish(in input, reason events.StopReason, answer *string) {
	m.emit(events.RunFinished{RunID: m.cfg.runID, Result: events.RunResult{
		RunID: m.cfg.runID, StopReason: reason, FinalAnswer: answer,
		SchemaVersion: events.CurrentSchemaVersion, EventDeliveryFailures: in.failures,
	}})
}

func (m *machine) modelCommand() command {
	return command{kind: cmdCallModel, model: seams.ModelCall{
		Messages: m.prompt[:len(m.prompt):len(m.prompt)], CallIndex: m.fold().Current.Model.CallIndex, RunID: m.cfg.runID,
		ResultID: m.fold().Current.Model.ResultID, Binding: m.cfg.binding,
	}}
}

func (m *machine) executeCommand() command {
	a, _ := m.action()
	return command{kind: cmdExecute, action: seams.ActionCall{
		Action: a, RunID: m.cfg.runID, StepIdx: m.fold().Current.Action.CallIndex, ResultID: m.fold().Current.Action.ResultID,
	}}
}

// announced reports whether the stored reply parses to the action the
// pending action intent announced: an action, calling the intent's tool
// when the intent names one (intents written before tool names were
// recorded name none).
func (m *machine) announced() bool {
	a, ok := m.parsed().Decision.(seams.Action)
	if !ok {
		return false
	}
	want := m.fold().Current.Action.ToolName
	return want == "" || a.ToolCall != nil && a.ToolCall.Name == want
}

// continueTail decides, after replay, what the tail of the log asks for:
// the recovery table, which lives in package recovery, as the fold plans.
func (m *machine) continueTail(in input) command {
	f := m.fold()
	if f.Finished != nil {
		return m.done()
	}
	if in.cancelled && f.Current.Model != nil {
		m.finish(in, events.StopCancelled, nil)
		return m.flush()
	}
	switch plan := f.Plan(); plan {
	case recovery.PlanNextStep:
		m.startStep(in)
	case recovery.PlanCallAgain:
		return m.modelCommand()
	case recovery.PlanExecuteAgain:
		if !m.announced() {
			// The stored reply no longer parses to the action its intent
			// announced (a log written under other bounds): what ran, or
			// would run, is not known.
			m.finish(in, events.StopResumeStateUnknown, nil)
			break
		}
		return m.executeCommand()
	case recovery.PlanStopUnknown:
		m.finish(in, events.StopResumeStateUnknown, nil)
	case recovery.PlanAwaitResolution:
		// The run asks that a side effect in doubt wait for an
		// operator's finding: say so durably, then wait.
		awaiting := *f.Current.Action
		awaiting.Awaits = events.AwaitsResolution
		m.emit(m.described(awaiting))
	case recovery.PlanAwaitDecision:
		return m.awaitCommand()
	case recovery.PlanExecuteApproved:
		m.executeApproved(in)
	case recovery.PlanCompleteRejected:
		text := "rejected by reviewer"
		if note := f.Current.Decision.Note; note != "" {
			text += ": " + note
		}
		m.completeAction(in, notExecuted(text))
	case recovery.PlanCompleteResolved:
		m.resolved(in)
	case recovery.PlanCompleteError:
		m.modelFailed(in)
	case recovery.PlanReparse:
		m.afterReply(in)
	default:
		return command{kind: cmdFail, err: fmt.Sprintf("no plan %s for tail state %s", plan, f.State())}
	}
	return m.flush()
}

func (m *machine) modelReturned(in input) command {
	if cur := &m.fold().Current; cur.Model == nil || cur.Reply != nil || cur.Failure != nil {
		return command{kind: cmdFail, err: "model return without a pending model call"}
	}
	switch {
	case in.err != nil && in.cancelled:
		m.finish(in, events.StopCancelled, nil)
	case in.err != nil || replyBytes(in.reply) > events.MaxTextBytes:
		failure := "model call failed"
		switch {
		case in.err != nil && in.err.Error() != "":
			failure = events.Clip(in.err.Error(), events.MaxTextBytes)
		case in.err == nil:
			failure = fmt.Sprintf("the model's reply is %d bytes, more than the %d a run stores (events.MaxTextBytes)",
				replyBytes(in.reply), events.MaxTextBytes)
		}
		m.emit(events.ModelCallResult{RunID: m.cfg.runID, ResultID: m.fold().Current.Model.ResultID, Failure: &failure})
		m.modelFailed(in)
	default:
		reply := in.reply
		m.emit(events.ModelCallResult{RunID: m.cfg.runID, ResultID: m.fold().Current.Model.ResultID, Reply: &reply})
		if in.cancelled {
			m.finish(in, events.StopCancelled, nil)
			break
		}
		m.afterReply(in)
	}
	return m.flush()
}

// replyBytes is the size of a reply's texts, which events.MaxTextBytes
// bounds together.
func replyBytes(r events.ModelReply) int { return len(r.Content) + len(r.Thinking) + len(r.CallID) }

// modelFailed completes the step of a failed model call and stops.
func (m *machine) modelFailed(in input) {
	rec := m.record(in)
	rec.Observation = m.cfg.synthetic.ModelCallFailed
	rec.ObservationIsSynthetic = true
	m.emit(events.StepCompleted{RunID: m.cfg.runID, Step: rec})
	m.startStep(in) // stops with llm_error
}

// parsed returns the parse of the stored reply, parsing it once. A parser
// that panics or returns no decision yields an InvalidDecision, so a broken
// parser cannot take the log with it and a re-parse gets the same answer.
func (m *machine) parsed() seams.ParsedReply {
	if m.cur.parsed == nil {
		p, args := safeParse(m.cfg.parser, *m.fold().Current.Reply)
		m.cur.parsed, m.cur.args = &p, args
	}
	return *m.cur.parsed
}

func safeParse(p seams.DecisionParser, r events.ModelReply) (seams.ParsedReply, string) {
	out := func() (out seams.ParsedReply) {
		defer func() {
			if v := recover(); v != nil {
				out = seams.ParsedReply{HistoryText: r.Content, Decision: seams.InvalidDecision{Explanation: "parser panicked: " + panicText(v)}}
			}
		}()
		return p.Parse(r)
	}()
	if out.Decision == nil {
		out.Decision = seams.InvalidDecision{Explanation: "parser returned no decision"}
	}
	return boundParse(out, r)
}

// maxToolNameBytes bounds a tool call's name: a name is stored, and quoted
// in the observation of a call to an unknown tool.
const maxToolNameBytes = 1024

// boundParse keeps what a parser derived from a reply (which is at most
// events.MaxTextBytes) within that bound too, so that the step record
// stays storable: a history text or decision text larger than it makes the
// decision invalid, with the reply's content as history text; an
// explanation is clipped. An action is never clipped: what runs is what the
// model said, or nothing. args is a tool call's arguments as the step
// record keeps them (toolArguments), measured here and kept for it.
func boundParse(p seams.ParsedReply, r events.ModelReply) (_ seams.ParsedReply, args string) {
	tooLarge := func(what string, n int) (seams.ParsedReply, string) {
		return seams.ParsedReply{HistoryText: r.Content, Decision: seams.InvalidDecision{Explanation: fmt.Sprintf(
			"the parser's %s is %d bytes, more than the %d a run stores (events.MaxTextBytes)", what, n, events.MaxTextBytes)}}, ""
	}
	if len(p.HistoryText) > events.MaxTextBytes {
		return tooLarge("history text", len(p.HistoryText))
	}
	switch d := p.Decision.(type) {
	case seams.FinalAnswer:
		if len(d.Text) > events.MaxTextBytes {
			return tooLarge("final answer", len(d.Text))
		}
	case seams.Action:
		if len(d.Text) > events.MaxTextBytes {
			return tooLarge("action", len(d.Text))
		}
		if tc := d.ToolCall; tc != nil {
			if n := len(tc.Name); n > maxToolNameBytes {
				return tooLarge("tool name", n)
			}
			if args = toolArguments(tc); len(args) > events.MaxTextBytes {
				return tooLarge("tool call's arguments", len(args))
			}
		}
	case seams.InvalidDecision:
		d.Explanation = events.Clip(d.Explanation, events.MaxTextBytes)
		p.Decision = d
	}
	return p, args
}

// afterReply plans what a stored reply leads to.
func (m *machine) afterReply(in input) {
	p := m.parsed()
	switch d := p.Decision.(type) {
	case seams.InvalidDecision:
		rec := m.record(in)
		rec.ParseError = &d.Explanation
		rec.Observation = m.wrap(d.Explanation)
		rec.ObservationIsSynthetic = true
		m.emit(events.StepCompleted{RunID: m.cfg.runID, Step: rec})
		m.startStep(in) // may stop with parse_failed_repeatedly
	case seams.FinalAnswer:
		rec := m.record(in)
		rec.ParseOK = true
		m.emit(events.StepCompleted{RunID: m.cfg.runID, Step: rec})
		m.startStep(in) // stops with agent_finished
	case seams.Action:
		policy, tool := events.ReplayNever, ""
		var spec seams.ToolSpec
		if d.ToolCall != nil {
			if err := m.validateTool(*d.ToolCall); err != nil {
				m.completeAction(in, m.refused(err))
				return
			}
			spec, _ = m.cfg.tools.SpecFor(d.ToolCall.Name)
			policy, tool = spec.ReplayPolicy, spec.Name
		}
		intent := events.Intent{RunID: m.cfg.runID, IntentKind: events.IntentAction, CallIndex: len(m.fold().Steps),
			ResultID: in.freshID, ReplayPolicy: policy, ToolName: tool}
		if spec.RequiresApproval || m.policyRequiresApproval(d) {
			intent.Awaits = events.AwaitsApproval
			intent = m.described(intent)
		}
		m.emit(intent)
	}
}

// policyRequiresApproval asks the request's approval policy about a; a
// policy that panics is taken to require approval, so a broken policy
// cannot let a call through unreviewed (nor take the log with it).
func (m *machine) policyRequiresApproval(a seams.Action) (yes bool) {
	if m.cfg.approval == nil {
		return false
	}
	defer func() {
		if recover() != nil {
			yes = true
		}
	}()
	return m.cfg.approval.RequiresApproval(a)
}

// described is an awaiting intent with what a person needs to decide on
// it: the call's arguments and the tool's parameter schema, as JSON text.
func (m *machine) described(in events.Intent) events.Intent {
	a, args := m.action()
	if a.ToolCall == nil {
		return in
	}
	in.Arguments = args
	if spec, ok := m.cfg.tools.SpecFor(a.ToolCall.Name); ok {
		if b, err := json.Marshal(spec.Parameters); err == nil && len(b) <= events.MaxTextBytes {
			in.ArgumentsSchema = string(b)
		}
	}
	return in
}

// awaitCommand stops the run, unfinished, waiting for a person's decision
// on the pending action.
func (m *machine) awaitCommand() command {
	p := recovery.PendingCallOf(*m.fold().Current.Action, m.cur.actionAt)
	return command{kind: cmdAwait, pending: &p}
}

// action is the action the step runs: the parsed one, with the arguments
// an approval edited in place of the model's, and its tool call's
// arguments as the step record keeps them.
func (m *machine) action() (seams.Action, string) {
	a, _ := m.parsed().Decision.(seams.Action)
	args := m.cur.args
	d := m.fold().Current.Decision
	if d == nil || d.Arguments == nil || a.ToolCall == nil {
		return a, args
	}
	tc := *a.ToolCall
	tc.Arguments = nil
	if err := json.Unmarshal([]byte(*d.Arguments), &tc.Arguments); err != nil {
		tc.Arguments = map[string]any{}
	}
	a.ToolCall = &tc
	return a, toolArguments(&tc)
}

// executeApproved carries out an approval: the action, with the arguments
// the approval edited, is checked against the registry again and its
// executing intent — the same result id, awaiting nothing — made durable;
// afterDurable then executes it. Arguments the registry refuses complete
// the step not executed, as any rejected call does.
func (m *machine) executeApproved(in input) {
	a, _ := m.action()
	if !m.announced() {
		m.finish(in, events.StopResumeStateUnknown, nil)
		return
	}
	if a.ToolCall != nil {
		if err := m.validateTool(*a.ToolCall); err != nil {
			m.completeAction(in, m.refused(err))
			return
		}
	}
	intent := *m.fold().Current.Action
	intent.Awaits, intent.Arguments, intent.ArgumentsSchema = "", "", ""
	m.emit(intent)
}

// resolved completes the step of an action in doubt as the operator found
// it, executing nothing: executed with the observation they gave, or not
// executed. Either observation is marked synthetic: the executor did not
// produce it.
func (m *machine) resolved(in input) {
	r := m.fold().Current.Resolution
	out := notExecuted("not executed (operator's finding: " + r.By + ")")
	if r.Verdict == events.VerdictExecuted {
		out = events.ActionOutcome{Status: events.StatusExecuted, ObservationIsSynthetic: true}
		if r.Observation != nil {
			out.Observation = *r.Observation
		}
	}
	m.completeAction(in, out)
}

// completeAction completes the step of its action — the parsed one, as an
// approval edited it — with outcome out (its observation clipped), under
// the result id of the step's action intent when one was written, and
// plans what follows: the next step, or the stop the step calls for.
func (m *machine) completeAction(in input, out events.ActionOutcome) {
	out = clipObservation(out)
	resultID := ""
	if act := m.fold().Current.Action; act != nil {
		resultID = act.ResultID
	}
	m.emit(events.StepCompleted{RunID: m.cfg.runID, ResultID: resultID, ActionOutcome: &out, Step: m.actionRecord(in, out)})
	m.startStep(in)
}

// notExecuted is the outcome of an action that did not run, text its
// synthetic observation.
func notExecuted(text string) events.ActionOutcome {
	return events.ActionOutcome{Status: events.StatusNotExecuted, Observation: text, ObservationIsSynthetic: true}
}

// refused is the outcome of a tool call the registry refused.
func (m *machine) refused(err error) events.ActionOutcome {
	return notExecuted(strings.ReplaceAll(m.cfg.synthetic.ActionRejected, "{error}", err.Error()))
}

func (m *machine) validateTool(tc seams.ToolCall) error {
	if m.cfg.tools == nil {
		return fmt.Errorf("%w %q: no tools are available", seams.ErrUnknownTool, tc.Name)
	}
	return m.cfg.tools.Validate(tc)
}

func (m *machine) actionReturned(in input) command {
	if m.fold().Current.Action == nil {
		return command{kind: cmdFail, err: "action return without a pending action"}
	}
	if in.err != nil && in.cancelled {
		m.finish(in, events.StopCancelled, nil)
		return m.flush()
	}
	out := in.outcome
	if in.err != nil || !out.Status.Valid() || out.ObservationTruncatedChars < 0 {
		cause := fmt.Sprintf("the executor returned an invalid outcome (status %q, observation_truncated_chars %d)",
			out.Status, out.ObservationTruncatedChars)
		if in.err != nil {
			cause = in.err.Error()
		}
		out = events.ActionOutcome{Status: events.StatusEnvError, Observation: m.cfg.synthetic.EnvFailed, ObservationIsSynthetic: true,
			EnvError: events.EnvErrorText(cause)}
	}
	if out.EnvError != nil {
		out.EnvError = events.EnvErrorText(*out.EnvError)
	}
	m.completeAction(in, out) // may stop with env_error or task_completed
	return m.flush()
}

// clipObservation cuts an observation larger than events.MaxTextBytes at a
// UTF-8 boundary and adds the code points cut to its truncated count.
func clipObservation(out events.ActionOutcome) events.ActionOutcome {
	if len(out.Observation) > events.MaxTextBytes {
		kept := events.Clip(out.Observation, events.MaxTextBytes)
		out.ObservationTruncatedChars += chars(out.Observation[len(kept):])
		out.Observation = kept
	}
	return out
}

// record is the step record's common part: index, model output, prompt
// size, call id and wall time since the model intent was durable.
func (m *machine) record(in input) events.StepRecord {
	rec := events.StepRecord{
		StepIdx:       m.fold().Current.Model.CallIndex,
		PromptChars:   m.promptChars(),
		SchemaVersion: events.CurrentSchemaVersion,
	}
	if !m.cur.intentAt.IsZero() && in.at.After(m.cur.intentAt) {
		rec.StepWallMs = in.at.Sub(m.cur.intentAt).Milliseconds()
	}
	if r := m.fold().Current.Reply; r != nil {
		rec.RawOutput = m.parsed().HistoryText
		rec.ContentChars = chars(r.Content)
		rec.ThinkingChars = chars(r.Thinking)
		if r.CallID != "" {
			id := r.CallID
			rec.CallID = &id
		}
	}
	return rec
}

// actionRecord is the step record of the step's action (m.action) with
// outcome out.
func (m *machine) actionRecord(in input, out events.ActionOutcome) events.StepRecord {
	a, args := m.action()
	rec := m.record(in)
	text := a.Text
	rec.Action = &text
	rec.ParseOK = true
	rec.Observation = m.wrap(out.Observation)
	rec.ObservationIsSynthetic = out.ObservationIsSynthetic
	rec.ObservationTruncatedChars = out.ObservationTruncatedChars
	rec.EnvReportedCompletion = out.EnvReportedCompletion
	status := out.Status
	rec.ActionStatus = &status
	if tc := a.ToolCall; tc != nil {
		name := tc.Name
		rec.ToolName = &name
		rec.ToolArguments = &args
	}
	return rec
}

// toolArguments is a tool call's arguments as the step record keeps them:
// JSON text, "{}" for none.
func toolArguments(tc *seams.ToolCall) string {
	if tc.Arguments != nil {
		if b, err := json.Marshal(tc.Arguments); err == nil {
			return string(b)
		}
	}
	return "{}"
}

// wrap applies the observation template.
func (m *machine) wrap(obs string) string {
	return strings.Replace(m.cfg.obsTemplate, "{observation}", obs, 1)
}

// chars is utf8.RuneCountInString, striding through ASCII a word at a
// time: prompts and replies are counted with every step, and are mostly
// ASCII. An invalid byte counts as one, as there.
func chars(s string) int {
	n := 0
	for len(s) > 0 {
		i := 0
		for len(s)-i >= 8 && asciiWord(s[i:i+8]) {
			i += 8
		}
		n, s = n+i, s[i:]
		if len(s) > 0 {
			_, size := utf8.DecodeRuneInString(s)
			n, s = n+1, s[size:]
		}
	}
	return n
}

// asciiWord reports whether the 8 bytes of w are all ASCII.
func asciiWord(w string) bool {
	return (uint64(w[0])|uint64(w[1])<<8|uint64(w[2])<<16|uint64(w[3])<<24|
		uint64(w[4])<<32|uint64(w[5])<<40|uint64(w[6])<<48|uint64(w[7])<<56)&0x8080808080808080 == 0
}

func messageChars(msg seams.Message) int {
	n := 0
	for _, b := range msg.Content {
		if t, ok := b.(seams.TextBlock); ok {
			n += chars(t.Text)
		}
	}
	return n
}
