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

// TestAPanicIsWordedAsFmtDoesWithinTheBound: a recovered panic value reads
// as %v prints it, cut to what a run stores.
func TestAPanicIsWordedAsFmtDoesWithinTheBound(t *testing.T) {
	huge := strings.Repeat("é", events.MaxTextBytes) // twice the bound in bytes
	for _, p := range []any{"boom", errors.New("bad"), 42, stringer{}, []int{1, 2}, huge, errors.New(huge)} {
		got, want := panicText(p), events.Clip(fmt.Sprintf("%v", p), events.MaxTextBytes)
		if got != want {
			t.Errorf("panicText of a %T: %.40q…, want %.40q…", p, got, want)
		}
	}
}
