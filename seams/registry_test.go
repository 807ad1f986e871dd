package seams_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

func echo(_ context.Context, args map[string]any) (string, error) { return fmt.Sprint(args["q"]), nil }

func registry(t *testing.T) *seams.Registry {
	t.Helper()
	r, err := seams.NewRegistry(
		seams.Tool{Spec: seams.ToolSpec{Name: "search", Description: "Search.", ReplayPolicy: events.ReplaySafe,
			Parameters: map[string]any{"type": "object", "required": []string{"q"}, "additionalProperties": false,
				"properties": map[string]any{"q": map[string]any{"type": "string", "minLength": 1}}}}, Handler: echo},
		seams.Tool{Spec: seams.ToolSpec{Name: "fail"}, Handler: func(context.Context, map[string]any) (string, error) {
			return "", errors.New("no such document")
		}},
		seams.Tool{Spec: seams.ToolSpec{Name: "broken"}, Handler: func(context.Context, map[string]any) (string, error) {
			return "", seams.EnvFailure(errors.New("database unreachable"))
		}},
		seams.Tool{Spec: seams.ToolSpec{Name: "panics"}, Handler: func(context.Context, map[string]any) (string, error) {
			panic("handler bug")
		}},
		seams.Tool{Spec: seams.ToolSpec{Name: "submit", CompletesRun: true}, Handler: echo},
	)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestNewRegistryRefusesBadTools(t *testing.T) {
	cases := map[string][]seams.Tool{
		"empty name":     {{Spec: seams.ToolSpec{}, Handler: echo}},
		"duplicate":      {{Spec: seams.ToolSpec{Name: "a"}, Handler: echo}, {Spec: seams.ToolSpec{Name: "a"}, Handler: echo}},
		"nil handler":    {{Spec: seams.ToolSpec{Name: "a"}}},
		"bad policy":     {{Spec: seams.ToolSpec{Name: "a", ReplayPolicy: "sometimes"}, Handler: echo}},
		"invalid schema": {{Spec: seams.ToolSpec{Name: "a", Parameters: map[string]any{"type": 12}}, Handler: echo}},
	}
	for name, tools := range cases {
		if _, err := seams.NewRegistry(tools...); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestValidate(t *testing.T) {
	r := registry(t)
	cases := []struct {
		call seams.ToolCall
		want error
	}{
		{seams.ToolCall{Name: "search", Arguments: map[string]any{"q": "bbolt"}}, nil},
		{seams.ToolCall{Name: "nope"}, seams.ErrUnknownTool},
		{seams.ToolCall{Name: "search"}, seams.ErrInvalidArguments},
		{seams.ToolCall{Name: "search", Arguments: map[string]any{"q": ""}}, seams.ErrInvalidArguments},
		{seams.ToolCall{Name: "search", Arguments: map[string]any{"q": 3}}, seams.ErrInvalidArguments},
		{seams.ToolCall{Name: "search", Arguments: map[string]any{"q": "x", "extra": true}}, seams.ErrInvalidArguments},
		{seams.ToolCall{Name: "submit", Arguments: map[string]any{"anything": 1}}, nil},
	}
	for _, c := range cases {
		err := r.Validate(c.call)
		if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("Validate(%+v) = %v, want %v", c.call, err, c.want)
		}
	}
}

func TestRestrictToReturnsANewRegistry(t *testing.T) {
	r := registry(t)
	phase, err := r.RestrictTo("search", "submit")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(phase.Names(), ","); got != "search,submit" {
		t.Errorf("restricted names %s", got)
	}
	if len(r.Names()) != 5 {
		t.Error("RestrictTo changed the original registry")
	}
	if err := phase.Validate(seams.ToolCall{Name: "fail"}); !errors.Is(err, seams.ErrUnknownTool) {
		t.Errorf("restricted registry validates a tool outside it: %v", err)
	}
	if strings.Contains(phase.SchemaForModel(), `"fail"`) {
		t.Error("restricted schema shows a tool outside it")
	}
	if _, err := r.RestrictTo("search", "missing"); err == nil {
		t.Error("RestrictTo accepted an unknown name")
	}
	if phase.Executor().Registry() != phase {
		t.Error("executor does not remember its registry")
	}
}

func TestExecutorOutcomes(t *testing.T) {
	r := registry(t)
	ex := r.Executor()
	call := func(name string, args map[string]any) (events.ActionOutcome, error) {
		return ex.Execute(context.Background(), seams.ActionCall{Action: seams.Action{ToolCall: &seams.ToolCall{Name: name, Arguments: args}}})
	}
	out, err := call("search", map[string]any{"q": "bbolt"})
	if err != nil || out.Status != events.StatusExecuted || out.Observation != "bbolt" {
		t.Errorf("search: %+v %v", out, err)
	}
	out, err = call("fail", nil)
	if err != nil || out.Status != events.StatusExecuted || out.Observation != "error: no such document" {
		t.Errorf("a handler error is an observation the model sees: %+v %v", out, err)
	}
	if _, err := call("broken", nil); err == nil || !seams.IsEnvFailure(err) {
		t.Errorf("an EnvFailure is an executor error: %v", err)
	}
	if _, err := call("panics", nil); err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Errorf("a panic is an executor error: %v", err)
	}
	if _, err := ex.Execute(context.Background(), seams.ActionCall{Action: seams.Action{Text: "ls"}}); err == nil {
		t.Error("a tool-less action was accepted")
	}
}

// TestSchemaForModelIsStable: the model sees the same text whatever order
// the tools were registered in, so provider prefix caching keeps working.
func TestSchemaForModelIsStable(t *testing.T) {
	a := seams.Tool{Spec: seams.ToolSpec{Name: "alpha", Description: "A."}, Handler: echo}
	b := seams.Tool{Spec: seams.ToolSpec{Name: "beta", Description: "B."}, Handler: echo}
	ab, _ := seams.NewRegistry(a, b)
	ba, _ := seams.NewRegistry(b, a)
	if ab.SchemaForModel() != ba.SchemaForModel() {
		t.Fatalf("schema depends on registration order:\n%s\n%s", ab.SchemaForModel(), ba.SchemaForModel())
	}
	if s := ab.SchemaForModel(); strings.Index(s, `"alpha"`) > strings.Index(s, `"beta"`) || !strings.Contains(s, `"description": "A."`) {
		t.Fatalf("schema: %s", s)
	}
}

func ExampleRegistry_RestrictTo() {
	all, _ := seams.NewRegistry(
		seams.Tool{Spec: seams.ToolSpec{Name: "read"}, Handler: echo},
		seams.Tool{Spec: seams.ToolSpec{Name: "annotate"}, Handler: echo},
		seams.Tool{Spec: seams.ToolSpec{Name: "submit", CompletesRun: true}, Handler: echo},
	)
	reading, _ := all.RestrictTo("read")
	reviewing, _ := all.RestrictTo("read", "annotate", "submit")
	fmt.Println(reading.Names(), reviewing.Names())
	// Output: [read] [annotate read submit]
}
