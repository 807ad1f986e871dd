package pgtest

import (
	"errors"
	"fmt"
	"testing"
)

// TestOnlyAMissingInstallationSkips: a test without a server is skipped
// only when PostgreSQL is not installed; a server that is installed but
// does not start (as when a misplaced option made initdb refuse it) fails
// the test, and POLYLOOP_PG_REQUIRED fails it either way.
func TestOnlyAMissingInstallationSkips(t *testing.T) {
	broken := errors.New(`pgtest: initdb: invalid argument: "fsync=on"`)
	for _, c := range []struct {
		required string
		err      error
		skip     bool
	}{
		{"", fmt.Errorf("lookup: %w", ErrNotInstalled), true},
		{"0", ErrNotInstalled, true},
		{"", broken, false},
		{"1", ErrNotInstalled, false},
		{"1", broken, false},
	} {
		t.Run(fmt.Sprintf("required=%q/%v", c.required, c.err), func(t *testing.T) {
			t.Setenv(RequiredEnv, c.required)
			if skip, why := unavailable(c.err); skip != c.skip || (!skip && why == "") {
				t.Errorf("skip %v (%q), want skip %v", skip, why, c.skip)
			}
		})
	}
}
