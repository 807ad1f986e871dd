package events

import (
	"errors"
	"fmt"
	"strings"
)

// ErrDamaged: a stored stream holds values that do not decode or fail their
// checksum, or events the store's records say it holds are missing.
var ErrDamaged = errors.New("events: stored stream is damaged")

// DamageError lists every problem a store found loading a run's stream.
// Stores return it (wrapped) from Load together with the events that did
// decode, in order, so recovery can list the damage beside what is
// structurally wrong with the rest; package recovery turns it into a
// *recovery.CorruptError.
type DamageError struct {
	RunID string
	// Problems are *DecodeError values (naming the key and what failed)
	// and the store's own findings (events missing, keys that are not
	// ULIDs).
	Problems []error
}

func (e *DamageError) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = p.Error()
	}
	return fmt.Sprintf("events: stored stream of run %q is damaged (%d problems):\n  %s", e.RunID, len(e.Problems), strings.Join(lines, "\n  "))
}

// Unwrap returns ErrDamaged.
func (e *DamageError) Unwrap() error { return ErrDamaged }
