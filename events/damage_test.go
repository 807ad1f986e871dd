package events_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/polyloop/polyloop/events"
)

// TestEveryDamageMatchesTheOneCorruptionMarker: a stream's damage, wrapped
// as stores wrap it, matches ErrCorruption and ErrDamaged; a layer's own
// sentinel matches itself and the marker, never another layer's; an error
// that is not damage matches none of them.
func TestEveryDamageMatchesTheOneCorruptionMarker(t *testing.T) {
	layer := events.NewCorruption("layer: store is corrupt")
	other := events.NewCorruption("other: store is corrupt")
	damage := &events.DamageError{RunID: "r", Problems: []error{errors.New("event 2 is missing")}}
	for _, c := range []struct {
		name       string
		err        error
		corruption bool
		matches    []error // sentinels it must match
		not        []error // sentinels it must not match
	}{
		{"a stream's damage", damage, true, []error{events.ErrDamaged}, []error{layer}},
		{"a store's load error wrapping both", fmt.Errorf("layer: load run %q: %w: %w", "r", layer, damage), true,
			[]error{layer, events.ErrDamaged}, []error{other}},
		{"a layer's sentinel wrapped", fmt.Errorf("%w: the index bucket is missing", layer), true,
			[]error{layer}, []error{other, events.ErrDamaged}},
		{"ErrDamaged itself", events.ErrDamaged, true, nil, []error{layer}},
		{"a store failure", errors.New("disk unplugged"), false, nil, []error{layer, events.ErrDamaged}},
		{"a decoding failure outside a stream", &events.DecodeError{Err: events.ErrUnknownMajor}, false, nil, []error{events.ErrDamaged}},
	} {
		if got := errors.Is(c.err, events.ErrCorruption); got != c.corruption {
			t.Errorf("%s: errors.Is(err, ErrCorruption) = %t, want %t", c.name, got, c.corruption)
		}
		for _, s := range c.matches {
			if !errors.Is(c.err, s) {
				t.Errorf("%s: does not match %q", c.name, s)
			}
		}
		for _, s := range c.not {
			if errors.Is(c.err, s) {
				t.Errorf("%s: matches %q", c.name, s)
			}
		}
	}
	if layer.Error() != "layer: store is corrupt" {
		t.Errorf("a sentinel's text is %q, want the text it was made with", layer.Error())
	}
}
