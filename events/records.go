package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"unicode/utf8"
)

// Kind names an event record type on the wire.
type Kind string

const (
	KindRunStarted      Kind = "run_started"       // a RunStarted record
	KindIntent          Kind = "intent"            // an Intent record
	KindModelCallResult Kind = "model_call_result" // a ModelCallResult record
	KindStepCompleted   Kind = "step_completed"    // a StepCompleted record
	KindRunFinished     Kind = "run_finished"      // a RunFinished record
	KindDecision        Kind = "decision"          // a Decision record (schema 1.5)
)

// Event is one of the six records of a run's stream. The set is closed.
type Event interface {
	// Kind is the record's wire kind.
	Kind() Kind
	// Validate reports, naming the field, why the record cannot be part of a
	// sound stream on its own (a missing run id, an unknown enum value, a
	// result that is both reply and failure...). Cross-record rules belong
	// to package recovery.
	Validate() error
	runID() string
}

// RunIDOf returns the run id carried by e.
func RunIDOf(e Event) string { return e.runID() }

// ModelReply is what a model call returned.
type ModelReply struct {
	// CallID is the provider's id for the call; "" means absent (an empty
	// string is never a valid id) and its key is then left out of the wire
	// map.
	CallID string `msgpack:"call_id,omitempty" json:"call_id"`
	// Content is the model-visible output.
	Content string `msgpack:"content" json:"content"`
	// Thinking is reasoning text, when the provider sends it.
	Thinking string `msgpack:"thinking" json:"thinking"`
	// Usage is what the call cost, when the provider reports it (nil:
	// not reported; also in logs before schema 1.2).
	Usage *Usage `msgpack:"usage,omitempty" json:"usage"`
}

// Usage is a model call's token counts as the provider reported them. Each
// count is optional: nil means not reported, which is not zero. Cached
// input tokens are part of the input tokens, reasoning tokens part of the
// output tokens (as OpenAI-compatible providers count them).
type Usage struct {
	InputTokens       *int64 `msgpack:"input_tokens" json:"input_tokens"`
	OutputTokens      *int64 `msgpack:"output_tokens" json:"output_tokens"`
	CachedInputTokens *int64 `msgpack:"cached_input_tokens" json:"cached_input_tokens"`
	ReasoningTokens   *int64 `msgpack:"reasoning_tokens" json:"reasoning_tokens"`
}

// Validate refuses negative counts.
func (u *Usage) Validate() error {
	if u == nil {
		return nil
	}
	for name, n := range map[string]*int64{"input_tokens": u.InputTokens, "output_tokens": u.OutputTokens,
		"cached_input_tokens": u.CachedInputTokens, "reasoning_tokens": u.ReasoningTokens} {
		if n != nil && *n < 0 {
			return fmt.Errorf("reply.usage.%s is negative (%d)", name, *n)
		}
	}
	return nil
}

// UsageTotals sums the usage of a run's model calls.
type UsageTotals struct {
	InputTokens       int64 `json:"input_tokens"`
	OutputTokens      int64 `json:"output_tokens"`
	CachedInputTokens int64 `json:"cached_input_tokens"`
	ReasoningTokens   int64 `json:"reasoning_tokens"`
	// Calls counts model calls that returned a reply; CallsWithoutUsage
	// those of them whose provider reported no usage (their tokens are
	// unknown, not zero). Failed calls report none and are not counted.
	Calls             int `json:"calls"`
	CallsWithoutUsage int `json:"calls_without_usage"`
}

// Add counts one reply's usage (nil: a reply without usage).
func (t *UsageTotals) Add(u *Usage) {
	t.Calls++
	if u == nil {
		t.CallsWithoutUsage++
		return
	}
	for _, c := range []struct {
		sum *int64
		n   *int64
	}{{&t.InputTokens, u.InputTokens}, {&t.OutputTokens, u.OutputTokens},
		{&t.CachedInputTokens, u.CachedInputTokens}, {&t.ReasoningTokens, u.ReasoningTokens}} {
		if c.n != nil {
			*c.sum = saturated(*c.sum, *c.n)
		}
	}
}

// Total is input plus output tokens: what Budget.MaxTotalTokens bounds.
// Sums saturate at the largest int64, so an absurd count reported by a
// provider cannot wrap a total negative and slip under a budget.
func (t UsageTotals) Total() int64 { return saturated(t.InputTokens, t.OutputTokens) }

// saturated is a+b for non-negative counts, at most math.MaxInt64.
func saturated(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// String is the totals for people: "1240 tokens (1000 in, 240 out, 800
// cached, 100 reasoning) over 5 calls", noting calls that reported none.
func (t UsageTotals) String() string {
	if t.Calls == t.CallsWithoutUsage {
		switch t.Calls {
		case 0:
			return "no model calls"
		case 1:
			return "tokens not reported (1 call)"
		}
		return fmt.Sprintf("tokens not reported (%d calls)", t.Calls)
	}
	s := fmt.Sprintf("%d tokens (%d in, %d out, %d cached, %d reasoning) over %d calls",
		t.Total(), t.InputTokens, t.OutputTokens, t.CachedInputTokens, t.ReasoningTokens, t.Calls)
	if t.CallsWithoutUsage > 0 {
		s += fmt.Sprintf("; %d reported none", t.CallsWithoutUsage)
	}
	return s
}

// ActionOutcome is what became of an action.
type ActionOutcome struct {
	Status                 ActionStatus `msgpack:"status" json:"status"`
	Observation            string       `msgpack:"observation" json:"observation"`
	ObservationIsSynthetic bool         `msgpack:"observation_is_synthetic" json:"observation_is_synthetic"`
	// EnvReportedCompletion is the environment's claim that the goal is
	// reached, never the agent's.
	EnvReportedCompletion     bool `msgpack:"env_reported_completion" json:"env_reported_completion"`
	ObservationTruncatedChars int  `msgpack:"observation_truncated_chars" json:"observation_truncated_chars"`
	// EnvError is why the environment failed, for an env_error outcome the
	// engine made from an executor's error (the error's text, at most
	// MaxEnvErrorBytes): the observation the model sees stays the synthetic
	// one, the cause stays in the log. Absent otherwise, and in logs before
	// schema 1.2.
	EnvError *string `msgpack:"env_error" json:"env_error"`
}

// MaxEnvErrorBytes bounds ActionOutcome.EnvError; a longer cause is cut
// (at a UTF-8 boundary) and marked with "…".
const MaxEnvErrorBytes = 4096

// EnvErrorText is cause as ActionOutcome.EnvError keeps it: at most
// MaxEnvErrorBytes, cut at a UTF-8 boundary and marked with "…".
func EnvErrorText(cause string) *string {
	if len(cause) > MaxEnvErrorBytes {
		cause = Clip(cause, MaxEnvErrorBytes-len("…")) + "…"
	}
	return &cause
}

// Clip returns the longest prefix of s of at most n bytes that ends at a
// UTF-8 boundary (s itself when it is short enough).
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Validate reports an invalid status.
func (o ActionOutcome) Validate() error {
	if !o.Status.Valid() {
		return fmt.Errorf("action_outcome.status %q is not one of executed, not_executed, env_error", o.Status)
	}
	if o.ObservationTruncatedChars < 0 {
		return errors.New("action_outcome.observation_truncated_chars is negative")
	}
	return nil
}

// StepRecord is one step of a trajectory. The first thirteen wire names are
// inherited and frozen. Character counts are Unicode code points. Pointer
// fields may be absent and are exported as JSON null.
type StepRecord struct {
	StepIdx                   int           `msgpack:"step_idx" json:"step_idx"`
	RawOutput                 string        `msgpack:"raw_output" json:"raw_output"`
	ContentChars              int           `msgpack:"content_chars" json:"content_chars"`
	ThinkingChars             int           `msgpack:"thinking_chars" json:"thinking_chars"`
	Action                    *string       `msgpack:"action" json:"action"`
	ParseOK                   bool          `msgpack:"parse_ok" json:"parse_ok"`
	ParseError                *string       `msgpack:"parse_error" json:"parse_error"`
	Observation               string        `msgpack:"observation" json:"observation"`
	ObservationIsSynthetic    bool          `msgpack:"observation_is_synthetic" json:"observation_is_synthetic"`
	ObservationTruncatedChars int           `msgpack:"observation_truncated_chars" json:"observation_truncated_chars"`
	PromptChars               int           `msgpack:"prompt_chars" json:"prompt_chars"`
	CallID                    *string       `msgpack:"call_id" json:"call_id"`
	StepWallMs                int64         `msgpack:"step_wall_ms" json:"step_wall_ms"`
	ToolName                  *string       `msgpack:"tool_name" json:"tool_name"`
	ToolArguments             *string       `msgpack:"tool_arguments" json:"tool_arguments"`
	ActionStatus              *ActionStatus `msgpack:"action_status" json:"action_status"`
	EnvReportedCompletion     bool          `msgpack:"env_reported_completion" json:"env_reported_completion"`
	SchemaVersion             string        `msgpack:"schema_version" json:"schema_version"`
}

// Validate reports a step record no stream could hold.
func (s StepRecord) Validate() error {
	switch {
	case s.StepIdx < 0:
		return errors.New("step.step_idx is negative")
	case s.ContentChars < 0, s.ThinkingChars < 0, s.PromptChars < 0, s.ObservationTruncatedChars < 0:
		return errors.New("step has a negative character count")
	case s.CallID != nil && *s.CallID == "":
		return errors.New("step.call_id is the empty string (absent is null)")
	case s.ActionStatus != nil && !s.ActionStatus.Valid():
		return fmt.Errorf("step.action_status %q is not a valid status", *s.ActionStatus)
	}
	return checkVersion("step.schema_version", s.SchemaVersion)
}

// RunResult is how a run ended.
type RunResult struct {
	RunID      string     `msgpack:"run_id" json:"run_id"`
	StopReason StopReason `msgpack:"stop_reason" json:"stop_reason"`
	// FinalAnswer is set only when the run stopped with agent_finished.
	FinalAnswer *string      `msgpack:"final_answer" json:"final_answer"`
	Steps       []StepRecord `msgpack:"steps,omitempty" json:"steps"`
	// SchemaVersion is the codec version the run was recorded with.
	SchemaVersion string `msgpack:"schema_version" json:"schema_version"`
	// EventDeliveryFailures counts sink errors and panics.
	EventDeliveryFailures int `msgpack:"event_delivery_failures" json:"event_delivery_failures"`
	// Usage sums the run's model calls. It is computed from the stream
	// (the engine and projections fill it), never stored: nil in a stored
	// RunFinished.
	Usage *UsageTotals `msgpack:"-" json:"usage,omitempty"`
}

// RunStarted is the first record of every stream.
type RunStarted struct {
	RunID             string            `msgpack:"run_id" json:"run_id"`
	ParameterSnapshot map[string]string `msgpack:"parameter_snapshot" json:"parameter_snapshot"`
	SchemaVersion     string            `msgpack:"schema_version" json:"schema_version"`
	// Agent names the agent the run was started for (schema 1.4), empty
	// for a run no worker pool claims; Input is what that agent builds
	// the run from, opaque to PolyLoop. A worker that claims the run
	// rebuilds its definition and request from the two.
	Agent string `msgpack:"agent,omitempty" json:"agent,omitempty"`
	Input []byte `msgpack:"input,omitempty" json:"input,omitempty"`
	// Fork, for a run forked from another (schema 1.6), says where it came
	// from; nil otherwise.
	Fork *ForkOrigin `msgpack:"fork,omitempty" json:"fork,omitempty"`
}

// ForkOrigin is where a forked run came from: its source run, the step
// it was forked at (the copied prefix is the source's steps 0..Step-1),
// the key of the source's last event copied (empty when Step is 0 and
// nothing was), and how the fork's parameters differ from the source's,
// listed as Resume lists a refusal's ("key: "a" at start, now "b"") —
// recorded, not refused. The copied events follow RunStarted in the
// fork's stream, payloads as the source stored them (they name the
// source run), under keys of the fork's own.
type ForkOrigin struct {
	Run         string   `msgpack:"run" json:"run"`
	Step        int      `msgpack:"step" json:"step"`
	LastKey     string   `msgpack:"last_key,omitempty" json:"last_key,omitempty"`
	Differences []string `msgpack:"differences,omitempty" json:"differences,omitempty"`
	// Ancestry is, for a fork of a fork, the runs whose events the copied
	// prefix holds before Run's own, oldest first: the prefix's steps
	// below Ancestry[0].Steps name Ancestry[0].Run, those below
	// Ancestry[1].Steps name Ancestry[1].Run, and so on; the rest, below
	// Step, name Run.
	Ancestry []Ancestor `msgpack:"ancestry,omitempty" json:"ancestry,omitempty"`
}

// Ancestor is a run whose events a fork's copied prefix holds: those of
// the steps below Steps not claimed by an earlier ancestor.
type Ancestor struct {
	Run   string `msgpack:"run" json:"run"`
	Steps int    `msgpack:"steps" json:"steps"`
}

// RunOfStep is the run whose events the copied prefix holds for step s
// (below Step): the first ancestor whose Steps is above s, or Run.
func (f ForkOrigin) RunOfStep(s int) string {
	for _, a := range f.Ancestry {
		if s < a.Steps {
			return a.Run
		}
	}
	return f.Run
}

// Intent is written, durably, before a side effect. ResultID is allocated
// before the side effect so its result can be matched after a crash.
type Intent struct {
	RunID        string       `msgpack:"run_id" json:"run_id"`
	IntentKind   IntentKind   `msgpack:"kind" json:"kind"`
	CallIndex    int          `msgpack:"call_index" json:"call_index"`
	ResultID     string       `msgpack:"result_id" json:"result_id"`
	ReplayPolicy ReplayPolicy `msgpack:"replay_policy" json:"replay_policy"`
	// ToolName names the tool an action intent will call; empty for model
	// calls and tool-less actions. It makes a log self-describing: an
	// inspector can say which tool's outcome a crash left in doubt.
	ToolName string `msgpack:"tool_name,omitempty" json:"tool_name,omitempty"`
	// Awaits, when set (schema 1.5), says the intent waits for a person:
	// AwaitsApproval — the action has not run and runs only once a
	// Decision approves it; AwaitsResolution — the action's outcome was
	// left in doubt by a crash (an earlier intent of the same result id)
	// and the run waits for an operator's finding. Empty: the action is
	// executed now, as every intent before 1.5 said.
	Awaits Awaits `msgpack:"awaits,omitempty" json:"awaits,omitempty"`
	// Arguments is the tool call's arguments as JSON text, and
	// ArgumentsSchema the tool's parameter schema (JSON Schema, as JSON
	// text), recorded on an awaiting intent so a person can see the call
	// and edit it — and a program check the edit — from the log alone.
	Arguments       string `msgpack:"arguments,omitempty" json:"arguments,omitempty"`
	ArgumentsSchema string `msgpack:"arguments_schema,omitempty" json:"arguments_schema,omitempty"`
}

// Decision is a person's word on an action intent awaiting one (schema
// 1.5): an approval or rejection of an action awaiting approval, or the
// finding on an action whose outcome a crash left in doubt (executed, with
// what was observed, or not executed). When it was made is its envelope's
// time. The engine then completes the step as the decision says.
type Decision struct {
	RunID string `msgpack:"run_id" json:"run_id"`
	// ResultID is the result id of the action intent decided on: the
	// call's id for people and commands.
	ResultID string  `msgpack:"result_id" json:"result_id"`
	Verdict  Verdict `msgpack:"verdict" json:"verdict"`
	// By names who decided, an opaque string the caller passes.
	By   string `msgpack:"by" json:"by"`
	Note string `msgpack:"note,omitempty" json:"note,omitempty"`
	// Arguments, for an approval only, are edited arguments (a JSON
	// object as text) the action runs with in place of the model's.
	Arguments *string `msgpack:"arguments,omitempty" json:"arguments,omitempty"`
	// Observation, for a finding of executed only, is what the operator
	// saw of the action's effect: the observation the model is fed.
	Observation *string `msgpack:"observation,omitempty" json:"observation,omitempty"`
}

// ModelCallResult records how a model call ended: exactly one of Reply and
// Failure is set.
type ModelCallResult struct {
	RunID    string      `msgpack:"run_id" json:"run_id"`
	ResultID string      `msgpack:"result_id" json:"result_id"`
	Reply    *ModelReply `msgpack:"reply" json:"reply"`
	Failure  *string     `msgpack:"failure" json:"failure"`
}

// StepCompleted closes a step. ResultID is non-empty exactly when an action
// intent was written for the step, and then equals that intent's result id;
// ActionOutcome is nil when no action was attempted.
type StepCompleted struct {
	RunID         string         `msgpack:"run_id" json:"run_id"`
	ResultID      string         `msgpack:"result_id" json:"result_id"`
	ActionOutcome *ActionOutcome `msgpack:"action_outcome" json:"action_outcome"`
	Step          StepRecord     `msgpack:"step" json:"step"`
}

// RunFinished is the last record of every run that stopped. Its Result holds
// no steps: they are in the stream as StepCompleted records already.
type RunFinished struct {
	RunID  string    `msgpack:"run_id" json:"run_id"`
	Result RunResult `msgpack:"result" json:"result"`
}

func (RunStarted) Kind() Kind      { return KindRunStarted }
func (Intent) Kind() Kind          { return KindIntent }
func (ModelCallResult) Kind() Kind { return KindModelCallResult }
func (StepCompleted) Kind() Kind   { return KindStepCompleted }
func (RunFinished) Kind() Kind     { return KindRunFinished }
func (Decision) Kind() Kind        { return KindDecision }

func (e RunStarted) runID() string      { return e.RunID }
func (e Intent) runID() string          { return e.RunID }
func (e ModelCallResult) runID() string { return e.RunID }
func (e StepCompleted) runID() string   { return e.RunID }
func (e RunFinished) runID() string     { return e.RunID }
func (e Decision) runID() string        { return e.RunID }

func requireRunID(id string) error {
	if id == "" {
		return errors.New("run_id is empty")
	}
	return nil
}

// Validate implements Event.
func (e RunStarted) Validate() error {
	if err := requireRunID(e.RunID); err != nil {
		return err
	}
	if n := len(e.ParameterSnapshot); n > MaxItems {
		return fmt.Errorf("parameter_snapshot has %d keys, more than %d (events.MaxItems)", n, MaxItems)
	}
	if e.Agent == "" && len(e.Input) > 0 {
		return errors.New("input is set without an agent to read it")
	}
	if n := len(e.Input); n > MaxTextBytes {
		return fmt.Errorf("input is %d bytes, more than %d (events.MaxTextBytes)", n, MaxTextBytes)
	}
	if f := e.Fork; f != nil {
		switch {
		case f.Run == "":
			return errors.New("fork.run is empty")
		case f.Run == e.RunID:
			return fmt.Errorf("fork.run is the run itself (%q)", e.RunID)
		case f.Step < 0:
			return fmt.Errorf("fork.step %d is negative", f.Step)
		case len(f.Differences) > MaxItems:
			return fmt.Errorf("fork.differences has %d entries, more than %d (events.MaxItems)", len(f.Differences), MaxItems)
		case len(f.Ancestry) > MaxItems:
			return fmt.Errorf("fork.ancestry has %d entries, more than %d (events.MaxItems)", len(f.Ancestry), MaxItems)
		}
		for i, a := range f.Ancestry {
			if a.Run == "" || a.Steps <= 0 || a.Steps > f.Step || i > 0 && a.Steps <= f.Ancestry[i-1].Steps {
				return fmt.Errorf("fork.ancestry[%d] (%q below step %d) is not a run of increasing steps below fork.step %d", i, a.Run, a.Steps, f.Step)
			}
		}
	}
	return checkVersion("schema_version", e.SchemaVersion)
}

// Validate implements Event.
func (e Intent) Validate() error {
	switch {
	case e.RunID == "":
		return requireRunID(e.RunID)
	case !e.IntentKind.Valid():
		return fmt.Errorf("kind %q is not one of model_call, action", e.IntentKind)
	case e.CallIndex < 0:
		return fmt.Errorf("call_index %d is negative", e.CallIndex)
	case e.ResultID == "":
		return errors.New("result_id is empty")
	case !e.ReplayPolicy.Valid():
		return fmt.Errorf("replay_policy %q is not one of never, safe", e.ReplayPolicy)
	case e.Awaits != "" && !e.Awaits.Valid():
		return fmt.Errorf("awaits %q is not one of approval, resolution", e.Awaits)
	case e.Awaits != "" && e.IntentKind != IntentAction:
		return fmt.Errorf("a %s intent awaits %s: only actions wait for a person", e.IntentKind, e.Awaits)
	case len(e.Arguments) > MaxTextBytes, len(e.ArgumentsSchema) > MaxTextBytes:
		return fmt.Errorf("arguments or arguments_schema is more than %d bytes (events.MaxTextBytes)", MaxTextBytes)
	}
	return nil
}

// Validate implements Event.
func (e Decision) Validate() error {
	switch {
	case e.RunID == "":
		return requireRunID(e.RunID)
	case e.ResultID == "":
		return errors.New("result_id is empty")
	case !e.Verdict.Valid():
		return fmt.Errorf("verdict %q is not one of approved, rejected, executed, not_executed", e.Verdict)
	case e.By == "":
		return errors.New("by is empty: a decision names who made it")
	case len(e.By) > maxNameBytes:
		return fmt.Errorf("by is %d bytes, more than %d", len(e.By), maxNameBytes)
	case len(e.Note) > MaxTextBytes:
		return fmt.Errorf("note is %d bytes, more than %d (events.MaxTextBytes)", len(e.Note), MaxTextBytes)
	case e.Arguments != nil && e.Verdict != VerdictApproved:
		return fmt.Errorf("arguments are set on a decision %s: only an approval edits arguments", e.Verdict)
	case e.Arguments != nil && len(*e.Arguments) > MaxTextBytes:
		return fmt.Errorf("arguments are %d bytes, more than %d (events.MaxTextBytes)", len(*e.Arguments), MaxTextBytes)
	case e.Arguments != nil && !jsonObject(*e.Arguments):
		return errors.New("arguments are not a JSON object")
	case e.Observation != nil && e.Verdict != VerdictExecuted:
		return fmt.Errorf("observation is set on a decision %s: only a finding of executed has one", e.Verdict)
	case e.Observation != nil && len(*e.Observation) > MaxTextBytes:
		return fmt.Errorf("observation is %d bytes, more than %d (events.MaxTextBytes)", len(*e.Observation), MaxTextBytes)
	}
	return nil
}

// maxNameBytes bounds a name a caller gives a record (Decision.By).
const maxNameBytes = 1024

// jsonObject reports whether s is one JSON object.
func jsonObject(s string) bool {
	var v map[string]any
	return json.Unmarshal([]byte(s), &v) == nil && v != nil
}

// Validate implements Event.
func (e ModelCallResult) Validate() error {
	switch {
	case e.RunID == "":
		return requireRunID(e.RunID)
	case e.ResultID == "":
		return errors.New("result_id is empty")
	case (e.Reply == nil) == (e.Failure == nil):
		return errors.New("exactly one of reply and failure must be set")
	case e.Reply != nil:
		return e.Reply.Usage.Validate()
	}
	return nil
}

// Validate implements Event.
func (e StepCompleted) Validate() error {
	if err := requireRunID(e.RunID); err != nil {
		return err
	}
	if e.ActionOutcome != nil {
		if err := e.ActionOutcome.Validate(); err != nil {
			return err
		}
		if e.ActionOutcome.Status != StatusNotExecuted && e.ResultID == "" {
			return fmt.Errorf("action_outcome %s requires a result_id", e.ActionOutcome.Status)
		}
	}
	return e.Step.Validate()
}

// Validate implements Event.
func (e RunFinished) Validate() error {
	if err := requireRunID(e.RunID); err != nil {
		return err
	}
	switch {
	case e.Result.RunID != e.RunID:
		return fmt.Errorf("result.run_id %q differs from run_id %q", e.Result.RunID, e.RunID)
	case !e.Result.StopReason.Valid():
		return fmt.Errorf("result.stop_reason %q is not a frozen stop reason", e.Result.StopReason)
	case len(e.Result.Steps) != 0:
		return errors.New("result.steps must be empty: steps live in the stream as step_completed")
	case e.Result.EventDeliveryFailures < 0:
		return errors.New("result.event_delivery_failures is negative")
	}
	return checkVersion("result.schema_version", e.Result.SchemaVersion)
}
