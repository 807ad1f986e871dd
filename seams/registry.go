package seams

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/polyloop/polyloop/events"
)

// ToolSpec describes a tool to the model and to the engine.
type ToolSpec struct {
	Name        string
	Description string
	// Parameters is the JSON Schema of the arguments object.
	Parameters map[string]any
	// ReplayPolicy says whether the tool may run again after a crash left its
	// outcome unknown; the zero value means never.
	ReplayPolicy events.ReplayPolicy
	// CompletesRun: executing this tool reaches the goal (task_completed).
	CompletesRun bool
	// RequiresApproval: every call of this tool waits, durably, for a
	// person's approval before it runs (engine.Decide); see also
	// ApprovalPolicy, which decides per call.
	RequiresApproval bool
}

// ApprovalPolicy decides per action whether a person must approve it
// before it runs (engine.Request.Approval): "refunds over 100", say, from
// the tool call's name and arguments. It is asked only for actions that
// passed validation and whose tool does not already require approval
// (ToolSpec.RequiresApproval). Like a seam it reports the Parameters that
// change its answers, recorded in the run's parameter snapshot (prefixed
// approval.), so a resumed run decides as the run did. It must be pure:
// no I/O, the same answer for the same action.
type ApprovalPolicy interface {
	RequiresApproval(a Action) bool
	Parameters() map[string]string
}

type actionCallKey struct{}

// CallOf returns the ActionCall a ToolHandler is serving: the run id, step
// and result id. A handler with a side effect can use the result id as an
// idempotency key, since a replay after a crash carries the same one.
func CallOf(ctx context.Context) (ActionCall, bool) {
	c, ok := ctx.Value(actionCallKey{}).(ActionCall)
	return c, ok
}

// ToolHandler runs a tool. Its returned text is the observation. An error is
// shown to the model as the observation (the tool ran and said no), unless
// it is marked with EnvFailure, which makes the step env_error and stops the
// run. A panic is caught and is an environment failure.
type ToolHandler func(ctx context.Context, args map[string]any) (string, error)

// Tool is a spec with its handler.
type Tool struct {
	Spec    ToolSpec
	Handler ToolHandler
}

// Registry is an immutable set of tools. Registration, the model-visible
// schema, validation and dispatch are all driven by one instance; phases of
// one consumer use RestrictTo to see different subsets. Safe for concurrent
// use.
type Registry struct {
	tools map[string]*registered
	names []string // sorted
}

type registered struct {
	spec    ToolSpec
	handler ToolHandler
	schema  *jsonschema.Schema
}

// NewRegistry checks and compiles the tools: names must be non-empty and
// unique, handlers non-nil, policies valid, and parameter schemas valid JSON
// Schema.
func NewRegistry(tools ...Tool) (*Registry, error) {
	r := &Registry{tools: make(map[string]*registered, len(tools))}
	for i, t := range tools {
		name := t.Spec.Name
		switch {
		case name == "":
			return nil, fmt.Errorf("seams: tool %d has no name", i)
		case r.tools[name] != nil:
			return nil, fmt.Errorf("seams: tool %q registered twice", name)
		case t.Handler == nil:
			return nil, fmt.Errorf("seams: tool %q has no handler", name)
		}
		spec := t.Spec
		if spec.ReplayPolicy == "" {
			spec.ReplayPolicy = events.ReplayNever
		}
		if !spec.ReplayPolicy.Valid() {
			return nil, fmt.Errorf("seams: tool %q: replay policy %q is not never or safe", name, spec.ReplayPolicy)
		}
		if spec.Parameters == nil {
			spec.Parameters = map[string]any{"type": "object"}
		}
		schema, err := compileSchema(name, spec.Parameters)
		if err != nil {
			return nil, err
		}
		r.tools[name] = &registered{spec: spec, handler: t.Handler, schema: schema}
		r.names = append(r.names, name)
	}
	slices.Sort(r.names)
	return r, nil
}

func compileSchema(tool string, params map[string]any) (*jsonschema.Schema, error) {
	// Normalise Go values (ints, typed maps) into the JSON value model.
	b, err := json.Marshal(params)
	if err != nil {
		return nil, fmt.Errorf("seams: tool %q: parameters are not JSON: %w", tool, err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("seams: tool %q: parameters: %w", tool, err)
	}
	c := jsonschema.NewCompiler()
	url := "polyloop:tool/" + tool
	if err := c.AddResource(url, doc); err != nil {
		return nil, fmt.Errorf("seams: tool %q: parameters: %w", tool, err)
	}
	s, err := c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("seams: tool %q: parameters are not a valid JSON Schema: %w", tool, err)
	}
	return s, nil
}

// Names lists the tools, sorted.
func (r *Registry) Names() []string { return slices.Clone(r.names) }

// RestrictTo returns a new registry holding only the named tools; an unknown
// name is an error. The receiver is unchanged.
func (r *Registry) RestrictTo(names ...string) (*Registry, error) {
	out := &Registry{tools: make(map[string]*registered, len(names))}
	for _, n := range names {
		t, ok := r.tools[n]
		if !ok {
			return nil, fmt.Errorf("seams: restrict to unknown tool %q", n)
		}
		if out.tools[n] == nil {
			out.tools[n] = t
			out.names = append(out.names, n)
		}
	}
	slices.Sort(out.names)
	return out, nil
}

// SpecFor returns the named tool's spec.
func (r *Registry) SpecFor(name string) (ToolSpec, bool) {
	t, ok := r.tools[name]
	if !ok {
		return ToolSpec{}, false
	}
	return t.spec, true
}

// SchemaForModel renders the tools as the JSON array the model sees: name,
// description and parameters of each, sorted by name. Stable across calls,
// so provider prefix caching works.
func (r *Registry) SchemaForModel() string {
	type entry struct {
		Name        string         `json:"name"`
		Description string         `json:"description"`
		Parameters  map[string]any `json:"parameters"`
	}
	list := make([]entry, 0, len(r.names))
	for _, n := range r.names {
		s := r.tools[n].spec
		list = append(list, entry{s.Name, s.Description, s.Parameters})
	}
	b, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		// Parameters were marshalled once already in NewRegistry.
		panic("seams: tool schema stopped being JSON: " + err.Error())
	}
	return string(b)
}

// Errors of Validate.
var (
	// ErrUnknownTool: the call names no tool of this registry.
	ErrUnknownTool = errors.New("seams: unknown tool")
	// ErrInvalidArguments: the arguments do not satisfy the tool's schema.
	ErrInvalidArguments = errors.New("seams: invalid tool arguments")
)

// Validate checks a call against the registry: the tool must exist and the
// arguments must satisfy its JSON Schema. A rejection is worded as the JSON
// Schema library words it, bounded however large the arguments: each value,
// name or location token from them cut to 256 bytes saying its size, lists
// to 16 entries, a location to its first and last 8 tokens, 64 causes.
func (r *Registry) Validate(call ToolCall) error {
	t, ok := r.tools[call.Name]
	if !ok {
		return fmt.Errorf("%w %q (known: %s)", ErrUnknownTool, call.Name, strings.Join(r.names, ", "))
	}
	args := call.Arguments
	if args == nil {
		args = map[string]any{}
	}
	b, err := json.Marshal(args)
	if err != nil {
		return fmt.Errorf("%w for %q: not JSON: %v", ErrInvalidArguments, call.Name, err)
	}
	return validateJSON(t.schema, call.Name, b)
}

// ValidateArguments checks args, a JSON object as text, against schema, a
// tool's parameter schema as JSON text, as Validate checks a call: for a
// recorded call whose registry is not at hand (edited arguments of an
// approval, checked against the schema its awaiting intent recorded).
// An error matches ErrInvalidArguments, or names a schema that does not
// compile.
func ValidateArguments(tool, schema, args string) error {
	var params map[string]any
	if err := json.Unmarshal([]byte(schema), &params); err != nil || params == nil {
		return fmt.Errorf("seams: tool %q: the recorded parameter schema is not a JSON object", tool)
	}
	compiled, err := compileSchema(tool, params)
	if err != nil {
		return err
	}
	var obj map[string]any
	if err := json.Unmarshal([]byte(args), &obj); err != nil || obj == nil {
		return fmt.Errorf("%w for %q: not a JSON object", ErrInvalidArguments, tool)
	}
	return validateJSON(compiled, tool, []byte(args))
}

// validateJSON checks a JSON document against a compiled schema.
func validateJSON(schema *jsonschema.Schema, tool string, doc []byte) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return fmt.Errorf("%w for %q: %v", ErrInvalidArguments, tool, err)
	}
	if err := schema.Validate(v); err != nil {
		if ve, ok := errors.AsType[*jsonschema.ValidationError](err); ok {
			return fmt.Errorf("%w for %q: %s", ErrInvalidArguments, tool, rejectionText(ve))
		}
		return fmt.Errorf("%w for %q: %v", ErrInvalidArguments, tool, err)
	}
	return nil
}

// Executor returns the ActionExecutor that dispatches to this registry's
// handlers. It remembers its registry (see ToolExecutor.Registry), which the
// engine checks against Request.Tools.
func (r *Registry) Executor() *ToolExecutor { return &ToolExecutor{registry: r} }

// ToolExecutor dispatches tool calls to a Registry's handlers.
type ToolExecutor struct{ registry *Registry }

var _ ActionExecutor = (*ToolExecutor)(nil)

// Registry is the registry this executor was derived from.
func (e *ToolExecutor) Registry() *Registry { return e.registry }

// envFailure marks an error as the environment's failure.
type envFailure struct{ err error }

func (e envFailure) Error() string { return e.err.Error() }
func (e envFailure) Unwrap() error { return e.err }

// EnvFailure marks err as a failure of the environment rather than an answer
// for the model: a tool handler returning it makes the step env_error.
func EnvFailure(err error) error {
	if err == nil {
		return nil
	}
	return envFailure{err}
}

// IsEnvFailure reports whether err was marked with EnvFailure.
func IsEnvFailure(err error) bool { return errors.As(err, new(envFailure)) }

// Execute validates and runs a tool call. A tool-less action, an invalid
// call, an EnvFailure and a panic are returned as errors (env_error); any
// other handler error becomes the observation.
func (e *ToolExecutor) Execute(ctx context.Context, call ActionCall) (out events.ActionOutcome, err error) {
	tc := call.Action.ToolCall
	if tc == nil {
		return events.ActionOutcome{}, errors.New("seams: tool executor got an action without a tool call")
	}
	if err := e.registry.Validate(*tc); err != nil {
		return events.ActionOutcome{}, err
	}
	defer func() {
		if p := recover(); p != nil {
			out, err = events.ActionOutcome{}, fmt.Errorf("seams: tool %q panicked: %v", tc.Name, p)
		}
	}()
	text, herr := e.registry.tools[tc.Name].handler(context.WithValue(ctx, actionCallKey{}, call), tc.Arguments)
	switch {
	case herr == nil:
	case IsEnvFailure(herr):
		return events.ActionOutcome{}, herr
	default:
		text = "error: " + herr.Error()
	}
	return events.ActionOutcome{Status: events.StatusExecuted, Observation: text}, nil
}

// Parameters implements ActionExecutor: the tool names and their policies.
func (e *ToolExecutor) Parameters() map[string]string {
	p := map[string]string{"kind": "tools"}
	for _, n := range e.registry.names {
		s := e.registry.tools[n].spec
		p["tool."+n] = fmt.Sprintf("policy=%s completes_run=%t", s.ReplayPolicy, s.CompletesRun)
	}
	return p
}
