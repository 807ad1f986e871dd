package pgtest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestMainLeavesOutTheExamplesAServerCannotServe: an example cannot skip
// itself, so where tests skip for want of PostgreSQL, Main leaves the
// server's examples the run selects out of it through -test.skip; with a
// server, or where a missing one is a failure, they run.
func TestMainLeavesOutTheExamplesAServerCannotServe(t *testing.T) {
	notInstalled := fmt.Errorf("lookup: %w", ErrNotInstalled)
	broken := errors.New("initdb: permission denied")
	examples := []string{"ExampleOpen", "ExampleStore_Runs"}
	for _, c := range []struct {
		name      string
		run, skip string
		required  bool
		lookup    error // what looking for a server finds; nil: one
		wantSkip  string
		lookedUp  bool // whether Main looks for a server before the run
		announced string
	}{
		{"every test, no PostgreSQL", "", "", false, notInstalled, "^(?:ExampleOpen|ExampleStore_Runs)$", true, "ExampleOpen, ExampleStore_Runs"},
		{"every test, a server", "", "", false, nil, "", true, ""},
		{"a broken PostgreSQL: they run and fail", "", "", false, broken, "", true, ""},
		{"POLYLOOP_PG_REQUIRED: they run and fail", "", "", true, notInstalled, "", true, ""},
		{"-run selecting no example: no server is looked for", "TestAppend", "", false, notInstalled, "", false, ""},
		{"-run selecting one", "Open", "", false, notInstalled, "^(?:ExampleOpen)$", true, "ExampleOpen"},
		{"-run selecting one by a subtest pattern", "Example/x", "", false, notInstalled, "^(?:ExampleOpen|ExampleStore_Runs)$", true, "ExampleOpen, ExampleStore_Runs"},
		{"-skip already leaving one out", "", "Runs", false, notInstalled, "Runs|^(?:ExampleOpen)$", true, "ExampleOpen"},
		{"-skip leaving both out: no server is looked for", "", "Example", false, notInstalled, "Example", false, ""},
		{"a -skip of subtests cannot be extended: they run and fail", "", "TestX/y", false, notInstalled, "TestX/y", true, "ExampleOpen, ExampleStore_Runs need a PostgreSQL server and -test.skip \"TestX/y\" cannot be extended"},
	} {
		t.Run(c.name, func(t *testing.T) {
			lookedUp := false
			skip, announced := leaveOut(examples, c.run, c.skip, c.required, func() error { lookedUp = true; return c.lookup })
			if skip != c.wantSkip {
				t.Errorf("-test.skip %q, want %q", skip, c.wantSkip)
			}
			if lookedUp != c.lookedUp {
				t.Errorf("looked for a server: %t, want %t", lookedUp, c.lookedUp)
			}
			if !strings.HasPrefix(announced, c.announced) || (c.announced == "") != (announced == "") {
				t.Errorf("said %q, want it to name %q", announced, c.announced)
			}
		})
	}
}
