package engine_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams/seamstest"
)

// TestAZeroBudgetFieldTakesItsDefault: a Budget field left zero is the
// documented default, in the run and in its parameter snapshot; a negative
// one is refused naming the field; MaxTotalTokens 0 stays "no limit".
func TestAZeroBudgetFieldTakesItsDefault(t *testing.T) {
	full := budget()
	for _, c := range []struct {
		field string
		key   string
		clear func(*engine.Budget)
		neg   func(*engine.Budget)
		def   int
	}{
		{"MaxSteps", "budget.max_steps", func(b *engine.Budget) { b.MaxSteps = 0 }, func(b *engine.Budget) { b.MaxSteps = -1 }, engine.DefaultMaxSteps},
		{"MaxActions", "budget.max_actions", func(b *engine.Budget) { b.MaxActions = 0 }, func(b *engine.Budget) { b.MaxActions = -1 }, engine.DefaultMaxActions},
		{"MaxConsecutiveParseFailures", "budget.max_consecutive_parse_failures",
			func(b *engine.Budget) { b.MaxConsecutiveParseFailures = 0 }, func(b *engine.Budget) { b.MaxConsecutiveParseFailures = -1 }, engine.DefaultMaxConsecutiveParseFailures},
		{"MaxPromptChars", "budget.max_prompt_chars", func(b *engine.Budget) { b.MaxPromptChars = 0 }, func(b *engine.Budget) { b.MaxPromptChars = -1 }, engine.DefaultMaxPromptChars},
	} {
		t.Run(c.field, func(t *testing.T) {
			a := newAgent(openKV(t), "zero", seamstest.Replies("FINAL: x")...)
			a.req.Budget = full
			c.clear(&a.req.Budget)
			snap, err := a.req.ParameterSnapshot()
			if err != nil {
				t.Fatalf("a zero %s: %v", c.field, err)
			}
			if got := snap[c.key]; got != strconv.Itoa(c.def) {
				t.Errorf("a zero %s is recorded as %q, want the default %d", c.field, got, c.def)
			}
			if r := a.run(t); r.StopReason != events.StopAgentFinished {
				t.Errorf("a zero %s: the run stopped %s", c.field, r.StopReason)
			}
			a.req.Budget = full
			c.neg(&a.req.Budget)
			if err := a.req.Validate(); !errors.Is(err, engine.ErrInvalidRequest) || !strings.Contains(err.Error(), "Budget."+c.field+" is -1") {
				t.Errorf("a negative %s: %v, want ErrInvalidRequest naming Budget.%s", c.field, err, c.field)
			}
		})
	}
	a := newAgent(openKV(t), "tokens")
	a.req.Budget = engine.Budget{}
	snap, err := a.req.ParameterSnapshot()
	if err != nil {
		t.Fatalf("a zero Budget: %v", err)
	}
	if v, ok := snap["budget.max_total_tokens"]; ok {
		t.Errorf("a zero MaxTotalTokens is recorded as %q: it means no limit, and stays absent", v)
	}
}

// TestAZeroBudgetStopsAtTheDefaultStepBudget: the default is the one the
// machine enforces, not only the one recorded.
func TestAZeroBudgetStopsAtTheDefaultStepBudget(t *testing.T) {
	turns := make([]string, engine.DefaultMaxSteps+1)
	for i := range turns {
		turns[i] = "ACTION: ls"
	}
	a := newAgent(seamstest.NewMemStore(), "steps", seamstest.Replies(turns...)...)
	a.req.Budget = engine.Budget{MaxActions: 10 * engine.DefaultMaxSteps}
	r := a.run(t)
	if r.StopReason != events.StopStepBudget || len(r.Steps) != engine.DefaultMaxSteps {
		t.Fatalf("stopped %s after %d steps, want step_budget after DefaultMaxSteps (%d)", r.StopReason, len(r.Steps), engine.DefaultMaxSteps)
	}
}

// TestResumeComparesTheEffectiveBudget: a run recorded with explicit
// budget values, resumed by a request that leaves the fields zero, resumes
// when the defaults equal what was recorded and is refused, listing each
// difference, when they do not.
func TestResumeComparesTheEffectiveBudget(t *testing.T) {
	defaults := engine.Budget{MaxSteps: engine.DefaultMaxSteps, MaxActions: engine.DefaultMaxActions,
		MaxConsecutiveParseFailures: engine.DefaultMaxConsecutiveParseFailures, MaxPromptChars: engine.DefaultMaxPromptChars}
	for _, c := range []struct {
		name     string
		recorded engine.Budget
		want     []string // the differences Resume lists; none: it resumes
	}{
		{"recorded equal to the defaults", defaults, nil},
		{"recorded other than the defaults", engine.Budget{MaxSteps: 7, MaxActions: engine.DefaultMaxActions,
			MaxConsecutiveParseFailures: 1, MaxPromptChars: engine.DefaultMaxPromptChars}, []string{
			`budget.max_steps: "7" at start, now "` + strconv.Itoa(engine.DefaultMaxSteps) + `"`,
			`budget.max_consecutive_parse_failures: "1" at start, now "` + strconv.Itoa(engine.DefaultMaxConsecutiveParseFailures) + `"`,
		}},
		{"a token budget recorded, none now", func() engine.Budget { b := defaults; b.MaxTotalTokens = 500; return b }(),
			[]string{`budget.max_total_tokens: "500" at start, now absent`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			store := openKV(t)
			a := newAgent(store, "old", seamstest.Replies("ACTION: ls", "FINAL: 3")...)
			a.req.Budget = c.recorded
			if _, err := engine.Start(context.Background(), a.def, a.req); err != nil {
				t.Fatal(err)
			}
			a.req.Budget = engine.Budget{}
			r, err := engine.Resume(context.Background(), a.def, a.req)
			if len(c.want) == 0 {
				if err != nil || r.StopReason != events.StopAgentFinished {
					t.Fatalf("got %s, %v; want the run resumed to agent_finished", r.StopReason, err)
				}
				return
			}
			if !errors.Is(err, engine.ErrParametersChanged) {
				t.Fatalf("got %v, want ErrParametersChanged", err)
			}
			if n := strings.Count(err.Error(), "\n  "); n != len(c.want) {
				t.Errorf("%d differences listed, want %d:\n%v", n, len(c.want), err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the refusal does not list %s:\n%v", w, err)
				}
			}
		})
	}
}

// TestAnUnsetExecutorIsDerivedFromTools: Tools alone is enough for a tool
// agent, and records what Tools.Executor() would; neither is an error
// naming both; a typed nil executor is still refused.
func TestAnUnsetExecutorIsDerivedFromTools(t *testing.T) {
	tools := toolRegistry(t)
	explicit := newAgent(openKV(t), "t", seamstest.Replies(`TOOL count {"dir":"."}`, `TOOL submit {}`)...)
	explicit.req.Tools, explicit.req.Executor = tools, tools.Executor()
	want, err := explicit.req.ParameterSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	derived := newAgent(openKV(t), "t", seamstest.Replies(`TOOL count {"dir":"."}`, `TOOL submit {}`)...)
	derived.req.Tools, derived.req.Executor = tools, nil
	got, err := derived.req.ParameterSnapshot()
	if err != nil {
		t.Fatalf("Tools without an Executor: %v", err)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("snapshot %s: %q derived, %q explicit", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("derived snapshot has %d keys, explicit %d", len(got), len(want))
	}
	r := derived.run(t)
	if r.StopReason != events.StopTaskCompleted || len(r.Steps) != 2 || r.Steps[0].Observation != "Observation: 3 files" {
		t.Fatalf("derived executor: %s after %d steps (%+v), want the tools run and task_completed", r.StopReason, len(r.Steps), r.Steps)
	}
	neither := newAgent(openKV(t), "n")
	neither.req.Executor = nil
	if err := neither.req.Validate(); !errors.Is(err, engine.ErrInvalidRequest) || !strings.Contains(err.Error(), "Executor and Tools are both nil") {
		t.Errorf("neither Executor nor Tools: %v, want ErrInvalidRequest naming both", err)
	}
	typedNil := newAgent(openKV(t), "n")
	typedNil.req.Tools, typedNil.req.Executor = tools, (*seamstest.Executor)(nil)
	if err := typedNil.req.Validate(); !errors.Is(err, engine.ErrInvalidRequest) || !strings.Contains(err.Error(), "Executor is a nil *seamstest.Executor") {
		t.Errorf("a typed nil Executor beside Tools: %v, want ErrInvalidRequest naming it", err)
	}
}
