package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode"

	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/stores"
)

// Exit statuses.
const (
	exitOK      = 0
	exitProblem = 1 // corrupt run, unreadable store
	exitUsage   = 2
)

// lockWait bounds the wait for a store held by a running process (a
// variable so tests can shorten it).
var lockWait = 2 * time.Second

const usage = `polyloop-inspect dumps and verifies PolyLoop event stores (read-only).

STORE is a bbolt file or a postgres:// URL (read in read-only transactions,
while agents write; ?polyloop_schema=NAME picks the schema).

Usage:
  polyloop-inspect runs STORE                  list runs: status, steps, stop reason, times
  polyloop-inspect events [--json] STORE RUN   every event of a run
  polyloop-inspect steps [--json] STORE RUN    a run's trajectory (StepRecord per step)
  polyloop-inspect verify STORE [RUN]          recovery's verdict for one or all runs

Run "polyloop-inspect COMMAND --help" for a command's details.
Exit status: 0 all well, 1 a run is corrupt or the store is unreadable, 2 bad usage.
`

// command is one subcommand.
type command struct {
	name string
	help string
	min  int // positional arguments
	max  int
	json bool // accepts --json
	run  func(w io.Writer, args []string, asJSON bool) int
}

var commands = []command{
	{name: "runs", min: 1, max: 1, run: runsCommand, help: `Usage: polyloop-inspect runs FILE

Lists every run of the store: run id, status, steps, stop reason, the time
of its first and last event. Status is one of
  finished  the run ended (see stop reason)
  running   no end recorded, nothing in doubt: in progress, or resumable
  in doubt  a crash left a side effect's outcome unknown (see verify)
  corrupt   the log breaks a structural rule (see verify)
`},
	{name: "events", min: 2, max: 2, json: true, run: eventsCommand, help: `Usage: polyloop-inspect events [--json] STORE RUN

Prints every event of RUN: ULID, time, kind and a one-line summary. With
--json, one JSON object per line: id, time, kind, schema_version, payload.
`},
	{name: "steps", min: 2, max: 2, json: true, run: stepsCommand, help: `Usage: polyloop-inspect steps [--json] STORE RUN

Prints RUN's trajectory as a table. With --json, JSON Lines with exactly the
eighteen StepRecord fields (absent values are null), readable as is by a
data-frame library.
`},
	{name: "verify", min: 1, max: 2, run: verifyCommand, help: `Usage: polyloop-inspect verify STORE [RUN]

Recovery's verdict for RUN, or for every run: finished; resumable, at which
breakpoint and what Resume would do; or corrupt, with every reason. For a run
in doubt it lists each side effect whose outcome is unknown (step, kind,
tool, result id, replay policy) and what Resume would do with it. Prints OK
or the number of corrupt runs last; exits 1 when any run is corrupt.
`},
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.invoke(args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "polyloop-inspect: unknown command %q\n\n%s", args[0], usage)
	return exitUsage
}

func (c command) invoke(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	asJSON := false
	if c.json {
		fs.BoolVar(&asJSON, "json", false, "print JSON")
	}
	// Flags may come before or after the positional arguments.
	var flags, positional []string
	for _, a := range args {
		if strings.HasPrefix(a, "-") && a != "-" {
			flags = append(flags, a)
		} else {
			positional = append(positional, a)
		}
	}
	if err := fs.Parse(flags); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, c.help)
			return exitOK
		}
		fmt.Fprintf(stderr, "polyloop-inspect %s: %v\n\n%s", c.name, err, c.help)
		return exitUsage
	}
	if len(positional) < c.min || len(positional) > c.max {
		fmt.Fprintf(stderr, "polyloop-inspect %s: wrong number of arguments\n\n%s", c.name, c.help)
		return exitUsage
	}
	return c.run(stdout, positional, asJSON)
}

// openStore opens a store file or a postgres:// URL read-only, waiting a
// bounded time for a bbolt file's writer.
func openStore(w io.Writer, path string) (stores.Store, bool) {
	s, err := stores.Open(context.Background(), path, stores.Options{ReadOnly: true, LockTimeout: lockWait})
	if err != nil {
		if errors.Is(err, kv.ErrLocked) {
			fmt.Fprintf(w, "error: %s is held for writing: %v; stop the writer or retry\n", path, err)
		} else {
			fmt.Fprintf(w, "error: %v\n", err)
		}
		return nil, false
	}
	return s, true
}

// escape makes text safe for a terminal: control and format characters
// (escape sequences, bidi overrides) are shown as Go escapes.
func escape(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == unicode.ReplacementChar:
			b.WriteString(`\ufffd`)
		case unicode.IsControl(r) || unicode.Is(unicode.Cf, r):
			if r < 0x100 {
				fmt.Fprintf(&b, `\x%02x`, r)
			} else {
				fmt.Fprintf(&b, `\u%04x`, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// clip escapes s and shortens it to n runes.
func clip(s string, n int) string {
	s = escape(s)
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}
