package engine

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/seams"
)

// Request is what is this run's: its id, goal (Context), budget, tools,
// executor and policies; what every run of the agent shares belongs in the
// Definition. Constructing and validating it does no I/O.
type Request struct {
	// RunID names the run; it follows the stores' rule (seams.ValidRunID:
	// non-empty, at most seams.MaxRunIDBytes of UTF-8, no control
	// characters), so a run no store could keep never starts.
	RunID string
	// Budget bounds the run; a zero field takes its default.
	Budget Budget
	// Executor carries out the run's actions. Nil: Tools.Executor(), the
	// registry's own; one of the two must be set.
	Executor seams.ActionExecutor
	// Tools, when set, is shown to the model and validates tool calls. If
	// Executor is a *seams.ToolExecutor it must come from this registry.
	Tools *seams.Registry
	// Context holds the messages around the history; contents are inputs,
	// not parameters.
	Context Context
	// Injections are skill texts by channel, placed after the run-level
	// messages: channels in sorted order, entries in the order given.
	Injections map[string][]Injection
	// ModelBinding is passed untouched to every ModelCall.
	ModelBinding map[string]string
	// ModelReplayPolicy says whether a model call whose outcome a crash left
	// unknown may be made again. It must be set.
	ModelReplayPolicy events.ReplayPolicy
	// ObservationTemplate wraps each observation fed back to the model; it
	// must hold "{observation}" exactly once. Empty means "{observation}".
	ObservationTemplate string
	// ToolSectionTemplate introduces the tools; it must hold "{tools}"
	// exactly once. Empty means DefaultToolSectionTemplate.
	ToolSectionTemplate string
	// CancelGrace bounds, from the moment ctx is cancelled, the appends
	// still owed: the outcome of a side effect that ran, and
	// RunFinished{cancelled}. Zero means DefaultCancelGrace.
	CancelGrace time.Duration
	// Agent names the agent the run is for, when a worker pool may drive
	// it (package worker): recorded in RunStarted with Input, the run is
	// queued in a store that hands runs to workers (seams.RunQueue) until
	// it finishes, and a worker that claims it rebuilds the definition and
	// request from the two. Empty: no pool claims the run. It follows
	// seams.ValidAgent. Resume refuses a request whose Agent or Input is
	// not the one recorded, as it refuses changed parameters.
	Agent string
	// Input is what Agent builds the run from, opaque to PolyLoop (at most
	// events.MaxTextBytes); it needs an Agent.
	Input []byte
	// Approval, when set, decides per action whether a person must
	// approve it before it runs, beside the tools whose spec requires
	// approval for every call (seams.ToolSpec.RequiresApproval). Such an
	// action's intent is made durable awaiting a decision and Run or
	// Resume returns an *AwaitingError; Decide records the decision, and
	// Resume continues. Its parameters are part of the snapshot
	// (approval.). A policy that panics is taken to require approval.
	Approval seams.ApprovalPolicy
	// AwaitResolution: an action whose outcome a crash left in doubt and
	// that may not be replayed (policy never) waits for an operator's
	// finding (Resolve) instead of ending the run resume_state_unknown:
	// Resume records that it awaits one and returns an *AwaitingError.
	// Part of the snapshot (await_resolution).
	AwaitResolution bool
	// OneEventPerTransaction turns write coalescing off: every event is its
	// own durable transaction (4 per step instead of 2), so tests can reach
	// every breakpoint a log can hold.
	OneEventPerTransaction bool
}

// Budget bounds a run. A field left zero takes its default
// (DefaultMaxSteps, DefaultMaxActions, DefaultMaxConsecutiveParseFailures,
// DefaultMaxPromptChars; MaxTotalTokens 0 is no limit), and the parameter
// snapshot records the value in force, so a run resumes under the budget it
// started with whether that was given or defaulted. A negative field is
// an invalid request.
type Budget struct {
	// MaxSteps bounds the steps (model calls) of the run: step_budget.
	MaxSteps int
	// MaxActions bounds the executed actions: action_budget.
	MaxActions int
	// MaxConsecutiveParseFailures bounds the replies in a row the parser
	// could not use: parse_failed_repeatedly.
	MaxConsecutiveParseFailures int
	// MaxPromptChars bounds the prompt in Unicode code points:
	// context_overflow.
	MaxPromptChars int
	// MaxTotalTokens bounds the run's tokens (input plus output, as the
	// model client reports them; 0: no limit). It is checked before each
	// model call against the total of the replies already durable: when
	// the total has reached it, the run stops with token_budget. One call
	// can overshoot it — its cost is known only once it returns — so the
	// last call's tokens may pass the line; and calls whose client reports
	// no usage count nothing (RunResult.Usage says how many did).
	MaxTotalTokens int64
}

// Context holds the run-level messages (first in the prompt) and the
// goal-level messages (after the injections and the tool section).
type Context struct {
	RunLevel, GoalLevel []seams.Message
}

// Injection is one skill entry.
type Injection struct {
	EntryID, Content string
}

// Defaults for empty Request fields, the Budget's included. The budget's
// are generous bounds for an interactive agent, not tuned to a model: a
// prompt of 100,000 code points is some 25,000 tokens of English.
const (
	DefaultMaxSteps                    = 50
	DefaultMaxActions                  = 50
	DefaultMaxConsecutiveParseFailures = 3
	DefaultMaxPromptChars              = 100_000

	DefaultObservationTemplate = "{observation}"
	DefaultToolSectionTemplate = "You can call these tools:\n{tools}"
	DefaultCancelGrace         = 2 * time.Second
)

// withDefaults is b with every zero field but MaxTotalTokens at its default.
func (b Budget) withDefaults() Budget {
	for _, f := range []struct {
		v   *int
		def int
	}{
		{&b.MaxSteps, DefaultMaxSteps}, {&b.MaxActions, DefaultMaxActions},
		{&b.MaxConsecutiveParseFailures, DefaultMaxConsecutiveParseFailures}, {&b.MaxPromptChars, DefaultMaxPromptChars},
	} {
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	return b
}

// withDefaults is r as a run uses it: the budget's zero fields at their
// defaults, and the executor derived from Tools when none is given.
func (r Request) withDefaults() Request {
	r.Budget = r.Budget.withDefaults()
	if r.Executor == nil && r.Tools != nil {
		r.Executor = r.Tools.Executor()
	}
	return r
}

func (r Request) observationTemplate() string {
	if r.ObservationTemplate == "" {
		return DefaultObservationTemplate
	}
	return r.ObservationTemplate
}

func (r Request) toolSectionTemplate() string {
	if r.ToolSectionTemplate == "" {
		return DefaultToolSectionTemplate
	}
	return r.ToolSectionTemplate
}

func (r Request) cancelGrace() time.Duration {
	if r.CancelGrace == 0 {
		return DefaultCancelGrace
	}
	return r.CancelGrace
}

// Validate reports every problem of the request, each naming its field. It
// does no I/O.
func (r Request) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	// The stores' rule, so a run no store could keep never starts.
	if err := seams.ValidRunID(r.RunID); err != nil {
		errs = append(errs, fmt.Errorf("RunID: %w", err))
	}
	if r.Agent != "" {
		if err := seams.ValidAgent(r.Agent); err != nil {
			errs = append(errs, fmt.Errorf("Agent: %w", err))
		}
	}
	switch {
	case r.Agent == "" && len(r.Input) > 0:
		bad("Input is set without an Agent to read it")
	case len(r.Input) > events.MaxTextBytes:
		bad("Input is %d bytes, more than %d (events.MaxTextBytes)", len(r.Input), events.MaxTextBytes)
	}
	for _, b := range []struct {
		name string
		v    int
	}{
		{"MaxSteps", r.Budget.MaxSteps}, {"MaxActions", r.Budget.MaxActions},
		{"MaxConsecutiveParseFailures", r.Budget.MaxConsecutiveParseFailures}, {"MaxPromptChars", r.Budget.MaxPromptChars},
	} {
		if b.v < 0 {
			bad("Budget.%s is %d, must be positive, or 0 for its default", b.name, b.v)
		}
	}
	if r.Budget.MaxTotalTokens < 0 {
		bad("Budget.MaxTotalTokens is %d, must be 0 (no limit) or positive", r.Budget.MaxTotalTokens)
	}
	te, fromRegistry := r.Executor.(*seams.ToolExecutor)
	switch {
	case r.Executor == nil && r.Tools == nil:
		bad("Executor and Tools are both nil: set Tools (its registry's executor runs the calls) or an Executor")
	case r.Executor == nil: // Tools.Executor()
	case isNil(r.Executor):
		bad("Executor is a nil %T (leave it unset to use Tools.Executor())", r.Executor)
	case fromRegistry && te.Registry() == nil:
		bad("Executor was derived from a nil *seams.Registry")
	case fromRegistry && te.Registry() != r.Tools:
		bad("Executor was derived from a registry other than Tools")
	}
	if !r.ModelReplayPolicy.Valid() {
		if r.ModelReplayPolicy == "" {
			bad("ModelReplayPolicy is unset: choose events.ReplaySafe or events.ReplayNever")
		} else {
			bad("ModelReplayPolicy %q is not never or safe", r.ModelReplayPolicy)
		}
	}
	if n := strings.Count(r.observationTemplate(), "{observation}"); n != 1 {
		bad("ObservationTemplate holds {observation} %d times, must hold it once", n)
	}
	if n := len(r.ObservationTemplate); n > events.MaxTextBytes {
		bad("ObservationTemplate is %d bytes, at most %d (events.MaxTextBytes): every observation is stored wrapped in it", n, events.MaxTextBytes)
	}
	if n := strings.Count(r.toolSectionTemplate(), "{tools}"); n != 1 {
		bad("ToolSectionTemplate holds {tools} %d times, must hold it once", n)
	}
	if r.CancelGrace < 0 {
		bad("CancelGrace is negative (%s)", r.CancelGrace)
	}
	for ch, list := range r.Injections {
		for i, inj := range list {
			if inj.EntryID == "" {
				bad("Injections[%q][%d].EntryID is empty", ch, i)
			}
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalidRequest, errors.Join(errs...))
}

// ParameterSnapshot reports the request's behaviour-changing settings, as
// the run uses them (a zero budget field as its default, an unset Executor
// as Tools'): budget, model replay policy, templates, grace, tool names (and those
// requiring approval: tools.requiring_approval), the approval policy
// (approval, and its parameters prefixed approval.), await_resolution,
// binding keys, injected entry ids and the executor's parameters
// (prefixed executor.). The keys of approvals are absent when unused, so
// runs from before them resume.
// Message contents are inputs, not parameters.
func (r Request) ParameterSnapshot() (map[string]string, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	r = r.withDefaults()
	out := map[string]string{
		"budget.max_steps":                      strconv.Itoa(r.Budget.MaxSteps),
		"budget.max_actions":                    strconv.Itoa(r.Budget.MaxActions),
		"budget.max_consecutive_parse_failures": strconv.Itoa(r.Budget.MaxConsecutiveParseFailures),
		"budget.max_prompt_chars":               strconv.Itoa(r.Budget.MaxPromptChars),
		"model_replay_policy":                   string(r.ModelReplayPolicy),
		"observation_template":                  r.observationTemplate(),
		"tool_section_template":                 r.toolSectionTemplate(),
		"cancel_grace":                          r.cancelGrace().String(),
	}
	if r.Budget.MaxTotalTokens > 0 { // absent when unset, so runs from before the budget resume
		out["budget.max_total_tokens"] = strconv.FormatInt(r.Budget.MaxTotalTokens, 10)
	}
	if r.Tools != nil {
		out["tools"] = strings.Join(r.Tools.Names(), ",")
		var approved []string
		for _, name := range r.Tools.Names() {
			if spec, _ := r.Tools.SpecFor(name); spec.RequiresApproval {
				approved = append(approved, name)
			}
		}
		if len(approved) > 0 { // absent when none, so runs from before approvals resume
			out["tools.requiring_approval"] = strings.Join(approved, ",")
		}
	}
	if !isNil(r.Approval) {
		out["approval"] = "on"
		prefixed(out, "approval.", r.Approval.Parameters())
	}
	if r.AwaitResolution {
		out[recovery.AwaitResolutionKey] = "true"
	}
	prefixed(out, "binding.", r.ModelBinding)
	injected := map[string]string{}
	for ch, list := range r.Injections {
		ids := make([]string, len(list))
		for i, inj := range list {
			ids[i] = inj.EntryID
		}
		injected[ch] = strings.Join(ids, ",")
	}
	prefixed(out, "injections.", injected)
	prefixed(out, "executor.", r.Executor.Parameters())
	return out, nil
}

// snapshot merges the definition's and the request's snapshots.
func snapshot(def Definition, req Request) (map[string]string, error) {
	d, err := def.ParameterSnapshot()
	if err != nil {
		return nil, err
	}
	r, err := req.ParameterSnapshot()
	if err != nil {
		return nil, err
	}
	// The definition's keys all carry a seam's prefix, the request's
	// none of those: the two never share a key.
	maps.Copy(d, r)
	return d, nil
}

// snapshotDiff lists every key whose value differs, with both values. A
// schema version (a key ending in schema_version) compares by its major: a
// reader of 1.x reads every 1.y log, so a minor bump of the codec between a
// crash and its resume changes nothing a run does.
func snapshotDiff(stored, now map[string]string) []string {
	keys := map[string]bool{}
	for k := range stored {
		keys[k] = true
	}
	for k := range now {
		keys[k] = true
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		a, inA := stored[k]
		b, inB := now[k]
		switch {
		case inA && inB && a == b:
		case inA && inB && strings.HasSuffix(k, "schema_version") && sameMajor(a, b):
		case !inA:
			out = append(out, fmt.Sprintf("%s: absent at start, now %q", k, b))
		case !inB:
			out = append(out, fmt.Sprintf("%s: %q at start, now absent", k, a))
		default:
			out = append(out, fmt.Sprintf("%s: %q at start, now %q", k, a, b))
		}
	}
	return out
}

// startedDiff lists how a run's recorded agent and input differ from
// req's, in snapshotDiff's words.
func startedDiff(started events.RunStarted, req Request) []string {
	var out []string
	if started.Agent != req.Agent {
		out = append(out, fmt.Sprintf("agent: %q at start, now %q", started.Agent, req.Agent))
	}
	if !bytes.Equal(started.Input, req.Input) {
		out = append(out, fmt.Sprintf("input: %d bytes at start (sha256 %.12x), now %d bytes (sha256 %.12x)",
			len(started.Input), sha256.Sum256(started.Input), len(req.Input), sha256.Sum256(req.Input)))
	}
	return out
}

// sameMajor reports whether two "major.minor" versions share their major.
func sameMajor(a, b string) bool {
	ma, _, okA := strings.Cut(a, ".")
	mb, _, okB := strings.Cut(b, ".")
	return okA && okB && ma == mb
}
