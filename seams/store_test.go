package seams_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
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

// TestTheStreamAfterRule: what follows the first seen events of a loaded
// stream — the rule LoadAfter keeps, and falls back to for stores that
// cannot read from the middle: the events after them when the seen-th is
// the caller's last; Load's error when not and Load reported one;
// ErrStreamChanged otherwise.
func TestTheStreamAfterRule(t *testing.T) {
	key := func(b byte) ulid.ULID { return ulid.ULID{15: b} }
	stream := []events.Envelope{{ID: key(1)}, {ID: key(2)}, {ID: key(3)}}
	damage := &events.DamageError{RunID: "r", Problems: []error{errors.New("event 4 is missing")}}
	for _, c := range []struct {
		name    string
		stream  []events.Envelope
		err     error
		seen    int
		last    ulid.ULID
		want    int   // events returned: the last want of stream
		wantErr error // nil, or what the error matches
	}{
		{"nothing seen", stream, nil, 0, ulid.ULID{}, 3, nil},
		{"some seen", stream, nil, 2, key(2), 1, nil},
		{"all seen", stream, nil, 3, key(3), 0, nil},
		{"nothing seen, nothing there", nil, nil, 0, ulid.ULID{}, 0, nil},
		{"the damage after those seen", stream, damage, 1, key(1), 2, events.ErrDamaged},
		{"more seen than there is", stream, nil, 4, key(4), 0, seams.ErrStreamChanged},
		{"another event where the last seen was", stream, nil, 2, key(9), 0, seams.ErrStreamChanged},
		{"a run gone", nil, nil, 1, key(1), 0, seams.ErrStreamChanged},
		{"damage where the last seen was", stream, damage, 2, key(9), 0, events.ErrDamaged},
	} {
		got, err := seams.StreamAfter("r", c.stream, c.err, c.seen, c.last)
		if len(got) != c.want || c.want > 0 && got[0].ID != c.stream[len(c.stream)-c.want].ID {
			t.Errorf("%s: %d events, want the last %d", c.name, len(got), c.want)
		}
		if c.wantErr == nil && err != nil || c.wantErr != nil && !errors.Is(err, c.wantErr) {
			t.Errorf("%s: %v, want %v", c.name, err, c.wantErr)
		}
		if errors.Is(err, seams.ErrStreamChanged) && !strings.Contains(err.Error(), `run "r"`) {
			t.Errorf("%s: %v does not name the run", c.name, err)
		}
	}
	if got, err := seams.StreamAfter("r", stream, nil, -1, ulid.ULID{}); err == nil || len(got) != 0 || !strings.Contains(err.Error(), "-1") {
		t.Errorf("a negative count seen: %d events, %v; want an error naming it", len(got), err)
	}
}

// TestNewOwnerNamesAHolderUniquely: a given name is kept as the owner's
// prefix, an empty one becomes host/pid, and two owners never share a
// name.
func TestNewOwnerNamesAHolderUniquely(t *testing.T) {
	host, _ := os.Hostname()
	for _, c := range []struct{ name, prefix string }{
		{"worker-7", "worker-7/"},
		{"", fmt.Sprintf("%s/%d/", host, os.Getpid())},
	} {
		a, b := seams.NewOwner(c.name), seams.NewOwner(c.name)
		if !strings.HasPrefix(a, c.prefix) || len(a) != len(c.prefix)+8 || a == b {
			t.Errorf("NewOwner(%q): %q and %q, want %q and 8 random hex digits, each its own", c.name, a, b, c.prefix)
		}
	}
}
