package engine

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// Definition is what is the same for every run of one agent: the model,
// the parser, the store and the event sink; what is this run's (its goal,
// budget, tools, executor) belongs in the Request. It is an immutable
// value, safe to share between concurrent runs.
type Definition struct {
	Model  seams.ModelClient
	Parser seams.DecisionParser
	Store  seams.RunStore
	// Events receives every durable event; nil discards them.
	Events    seams.EventSink
	Synthetic SyntheticObservations
	// Interrupt, once closed, stops the run at its next step boundary —
	// before the next model call is announced — and Run or Resume return
	// an error wrapping ErrInterrupted. Nothing is in doubt there and
	// nothing is written for the stop: the run stays unfinished and
	// Resume continues it. It is how a worker shuts down without
	// cancelling its runs (cancelling the context ends a run cancelled).
	// A step in progress completes first, its side effect included; a run
	// that would stop anyway (a budget, a final answer) finishes. Nil:
	// the run is never interrupted.
	Interrupt <-chan struct{}
}

// SyntheticObservations are the texts the engine writes when there is no
// real observation. Empty fields take the defaults below.
type SyntheticObservations struct {
	// ActionRejected is fed back for a tool call the registry refused; a
	// "{error}" in it is replaced by the reason.
	ActionRejected string
	// EnvFailed is the observation of an executor error or panic.
	EnvFailed string
	// ModelCallFailed is the observation of a failed model call.
	ModelCallFailed string
}

// Default synthetic observations.
const (
	DefaultActionRejected  = "The tool call was rejected: {error}"
	DefaultEnvFailed       = "The environment failed while executing the action."
	DefaultModelCallFailed = "The model call failed."
)

func (s SyntheticObservations) withDefaults() SyntheticObservations {
	if s.ActionRejected == "" {
		s.ActionRejected = DefaultActionRejected
	}
	if s.EnvFailed == "" {
		s.EnvFailed = DefaultEnvFailed
	}
	if s.ModelCallFailed == "" {
		s.ModelCallFailed = DefaultModelCallFailed
	}
	return s
}

func (d Definition) validate() error {
	var missing []string
	for _, seam := range []struct {
		name string
		v    any
	}{{"Model", d.Model}, {"Parser", d.Parser}, {"Store", d.Store}} {
		if isNil(seam.v) {
			missing = append(missing, seam.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: Definition.%s is nil", ErrInvalidDefinition, strings.Join(missing, ", Definition."))
	}
	if d.Events != nil && isNil(d.Events) {
		return fmt.Errorf("%w: Definition.Events is a nil %T (leave it unset to discard events)", ErrInvalidDefinition, d.Events)
	}
	for _, syn := range []struct{ name, text string }{
		{"ActionRejected", d.Synthetic.ActionRejected}, {"EnvFailed", d.Synthetic.EnvFailed}, {"ModelCallFailed", d.Synthetic.ModelCallFailed},
	} {
		if len(syn.text) > events.MaxTextBytes {
			return fmt.Errorf("%w: Definition.Synthetic.%s is %d bytes, at most %d (events.MaxTextBytes): it is stored in steps",
				ErrInvalidDefinition, syn.name, len(syn.text), events.MaxTextBytes)
		}
	}
	return nil
}

// isNil reports whether v is nil or an interface holding a nil pointer, map,
// slice, function or channel: a seam that would panic when called.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return rv.IsNil()
	}
	return false
}

// ParameterSnapshot merges the seams' parameters, prefixed by seam (model.,
// parser., store., events.), with the three synthetic texts. It fails when
// the definition is incomplete. (No key can be reported twice: each source
// is a map, filed under a prefix of its own.)
func (d Definition) ParameterSnapshot() (map[string]string, error) {
	if err := d.validate(); err != nil {
		return nil, err
	}
	s := d.Synthetic.withDefaults()
	out := map[string]string{}
	prefixed(out, "model.", d.Model.Parameters())
	prefixed(out, "parser.", d.Parser.Parameters())
	prefixed(out, "store.", d.Store.Parameters())
	if d.Events != nil {
		prefixed(out, "events.", d.Events.Parameters())
	}
	prefixed(out, "synthetic.", map[string]string{
		"action_rejected": s.ActionRejected, "env_failed": s.EnvFailed, "model_call_failed": s.ModelCallFailed,
	})
	return out, nil
}

// prefixed copies src into dst, each key under prefix.
func prefixed(dst map[string]string, prefix string, src map[string]string) {
	for k, v := range src {
		dst[prefix+k] = v
	}
}

// Errors of Run and Resume.
var (
	// ErrRunExists: Run was asked to start a run id that already has a log.
	ErrRunExists = seams.ErrRunExists
	// ErrRunNotFound: Resume was asked to continue a run id with no log.
	ErrRunNotFound = errors.New("engine: run not found")
	// ErrInvalidDefinition: a Definition is missing a seam.
	ErrInvalidDefinition = errors.New("engine: invalid definition")
	// ErrInvalidRequest: a Request was rejected; the message names the field.
	ErrInvalidRequest = errors.New("engine: invalid request")
	// ErrRunBusy: another driver holds the run or continued it first. Either
	// the store's run lock (seams.RunLocker) was held, and this driver read
	// and executed nothing, or an append found that the stream's tail had
	// moved (seams.ErrTailMoved), and this driver stopped at once, executing
	// nothing more: one run has one driver, and the other one's
	// continuation is the run's.
	ErrRunBusy = errors.New("engine: run is busy: another driver holds or continued it")
	// ErrInterrupted: Definition.Interrupt stopped the run at a step
	// boundary; it is unfinished, nothing is in doubt, and Resume
	// continues it.
	ErrInterrupted = errors.New("engine: run interrupted at a step boundary (it can be resumed)")
	// ErrCancelRequested is the cause of a run's context when the run
	// ended cancelled because an operator asked its store to cancel it
	// (Cancel, seams.RunCanceller).
	ErrCancelRequested = errors.New("engine: cancellation requested through the store")
	// ErrParametersChanged: Resume found a parameter snapshot different from
	// the one the run started with; the message lists every differing key.
	ErrParametersChanged = errors.New("engine: parameters changed since the run started")
	// ErrAwaitingDecision: the run waits, unfinished, for a person's
	// decision; every error that says so is an *AwaitingError.
	ErrAwaitingDecision = errors.New("engine: run awaits a person's decision")
)
