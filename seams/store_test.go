package seams_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/polyloop/polyloop/seams"
)

// TestTheRunIDRule: a run id is non-empty, at most MaxRunIDBytes bytes of
// valid UTF-8, without control characters; anything else is refused with
// ErrInvalidRunID and a message saying what is wrong, short whatever the
// id's length.
func TestTheRunIDRule(t *testing.T) {
	for _, id := range []string{
		"r", "run 1", "ünïcödé", "🙂", "a/b?c#d%&run=x", `quote"and\backslash`,
		"\u00a0nbsp", "zero\u200bwidth", strings.Repeat("x", seams.MaxRunIDBytes), strings.Repeat("é", seams.MaxRunIDBytes/2),
	} {
		if err := seams.ValidRunID(id); err != nil {
			t.Errorf("ValidRunID(%.40q) = %v, want nil", id, err)
		}
	}
	for _, c := range []struct{ id, says string }{
		{"", "empty"},
		{"a\x00b", `"a\x00b": it holds a NUL byte`},
		{"\x00", "NUL byte"},
		{"\xff", `"\xff": it is not valid UTF-8`},
		{"ok\xc3", "not valid UTF-8"},
		{"a\nb", "control character U+000A"},
		{"a\tb", "control character U+0009"},
		{"\x1b[31mred", "control character U+001B"},
		{"del\x7f", "control character U+007F"},
		{"c1\u0085", "control character U+0085"},
		{strings.Repeat("x", seams.MaxRunIDBytes+1), "1025 bytes, longer than the 1024-byte limit"},
		{strings.Repeat("é", seams.MaxRunIDBytes/2+1), "1026 bytes, longer than the 1024-byte limit"},
		{strings.Repeat("x", 1<<20), "1048576 bytes"},
	} {
		err := seams.ValidRunID(c.id)
		if !errors.Is(err, seams.ErrInvalidRunID) || !strings.Contains(fmt.Sprint(err), c.says) || len(fmt.Sprint(err)) > 200 {
			t.Errorf("ValidRunID(%.40q) = %v, want ErrInvalidRunID saying %q (in under 200 bytes)", c.id, err, c.says)
		}
	}
}
