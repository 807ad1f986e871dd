package engine

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/polyloop/polyloop/events"
)

type stringer struct{}

func (stringer) String() string { return "a stringer" }

// nilError is an error whose Error method dereferences its receiver.
type nilError struct{ text string }

func (e *nilError) Error() string { return e.text }

// formatted is an error that formats itself otherwise than its Error text.
type formatted struct{}

func (formatted) Error() string                 { return "plain" }
func (formatted) Format(f fmt.State, verb rune) { fmt.Fprint(f, "formatted") }

// TestAPanicIsWordedAsFmtDoesWithinTheBound: a recovered panic value reads
// as %v prints it, cut to what a run stores — a nil error pointer whose
// Error method panics and an error that formats itself included.
func TestAPanicIsWordedAsFmtDoesWithinTheBound(t *testing.T) {
	huge := strings.Repeat("é", events.MaxTextBytes) // twice the bound in bytes
	for _, p := range []any{"boom", errors.New("bad"), 42, stringer{}, []int{1, 2}, huge, errors.New(huge), (*nilError)(nil), formatted{}} {
		got, want := panicText(p), events.Clip(fmt.Sprintf("%v", p), events.MaxTextBytes)
		if got != want {
			t.Errorf("panicText of a %T: %.40q…, want %.40q…", p, got, want)
		}
	}
}
