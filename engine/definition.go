package engine

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/polyloop/polyloop/seams"
)

// Definition is what stays the same across the runs of one agent: the model,
// the parser, the store and the event sink. It is an immutable value, safe to
// share between concurrent runs.
type Definition struct {
	Model  seams.ModelClient
	Parser seams.DecisionParser
	Store  seams.RunStore
	// Events receives every durable event; nil discards them.
	Events    seams.EventSink
	Synthetic SyntheticObservations
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
// the definition is incomplete or a key is reported twice with different
// values.
func (d Definition) ParameterSnapshot() (map[string]string, error) {
	if err := d.validate(); err != nil {
		return nil, err
	}
	s := d.Synthetic.withDefaults()
	out := map[string]string{}
	var conflicts []string
	merge(out, "model.", d.Model.Parameters(), &conflicts)
	merge(out, "parser.", d.Parser.Parameters(), &conflicts)
	merge(out, "store.", d.Store.Parameters(), &conflicts)
	if d.Events != nil {
		merge(out, "events.", d.Events.Parameters(), &conflicts)
	}
	merge(out, "synthetic.", map[string]string{
		"action_rejected": s.ActionRejected, "env_failed": s.EnvFailed, "model_call_failed": s.ModelCallFailed,
	}, &conflicts)
	return out, conflictError(conflicts)
}

// merge copies src into dst under prefix, noting keys already present with
// a different value.
func merge(dst map[string]string, prefix string, src map[string]string, conflicts *[]string) {
	for _, k := range slices.Sorted(maps.Keys(src)) {
		key, v := prefix+k, src[k]
		if old, ok := dst[key]; ok && old != v {
			*conflicts = append(*conflicts, fmt.Sprintf("%s: %q vs %q", key, old, v))
			continue
		}
		dst[key] = v
	}
}

func conflictError(conflicts []string) error {
	if len(conflicts) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrParameterConflict, strings.Join(conflicts, "; "))
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
	// ErrParameterConflict: one parameter key was reported with two values.
	ErrParameterConflict = errors.New("engine: conflicting parameter")
	// ErrRunBusy: another driver holds the run or continued it first. Either
	// the store's run lock (seams.RunLocker) was held, and this driver read
	// and executed nothing, or an append found that the stream's tail had
	// moved (seams.ErrTailMoved), and this driver stopped at once, executing
	// nothing more: one run has one driver, and the other one's
	// continuation is the run's.
	ErrRunBusy = errors.New("engine: run is busy: another driver holds or continued it")
	// ErrParametersChanged: Resume found a parameter snapshot different from
	// the one the run started with; the message lists every differing key.
	ErrParametersChanged = errors.New("engine: parameters changed since the run started")
)
