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

	"github.com/polyloop/polyloop/cmd/internal/buildinfo"
	"github.com/polyloop/polyloop/cmd/internal/cliflags"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/report"
	"github.com/polyloop/polyloop/stores"
)

// Exit statuses, the same for every command.
const (
	exitOK      = 0 // all well
	exitProblem = 1 // a problem found: a corrupt run, a run in no store, a store that cannot be read
	exitUsage   = 2 // bad usage
)

// lockWait bounds the wait for a store held by a running process (a
// variable so tests can shorten it).
var lockWait = 2 * time.Second

const usage = `polyloop-inspect dumps and verifies PolyLoop event stores (read-only).

STORE is a bbolt file or a PostgreSQL connection string: a postgres:// URL
or a key=value string as libpq takes them (read in read-only transactions,
while agents write; polyloop_schema=NAME picks the schema). A password in
it is never printed. A bbolt file an agent writes is read through the
agent's socket beside it (FILE.sock), live; the file is held only while
read, so an agent can start while a command runs.

Usage:
  polyloop-inspect runs [--json] [filters] STORE          list runs, newest first
  polyloop-inspect events [--json] [--follow] STORE RUN   every event of a run
  polyloop-inspect steps [--json] STORE RUN               a run's trajectory (StepRecord per step)
  polyloop-inspect verify [--json] STORE [RUN]            recovery's verdict for one or all runs
  polyloop-inspect export [--run RUN]... STORE            the steps of many runs as one JSON Lines table
  polyloop-inspect serve [--addr ADDR] STORE              the run viewer in a browser (read-only)
  polyloop-inspect --version                              the module version and VCS revision it was built from

Run "polyloop-inspect COMMAND --help" for a command's details.
A forked run (engine.Fork: a new run from another's first K steps, under
another model, prompt or parser) says where it came from, and a source
names its forks, in runs, verify, steps, events and the viewer. Forking
writes, so it is not here: polyloop-admin fork.
Output goes to standard output, errors to standard error.
Exit status (every command): 0 all well, 1 a problem found (a corrupt run, a
run not in the store, a store that cannot be read), 2 bad usage.
`

// command is one subcommand.
type command struct {
	name  string
	help  string
	min   int // positional arguments
	max   int
	flags func(fs *flag.FlagSet, c *call)
	run   func(c *call) int
}

// call is one invocation of a command: its arguments, flags and outputs.
type call struct {
	stdout, stderr io.Writer
	args           []string
	json           bool
	filter         runFilter // runs
	runs           multiFlag // export --run
	follow         bool      // events --follow
	addr           string    // serve --addr
}

// fail reports a problem on standard error and returns exitProblem.
func (c *call) fail(format string, a ...any) int {
	fmt.Fprintf(c.stderr, "polyloop-inspect: "+format+"\n", a...)
	return exitProblem
}

// multiFlag collects a repeated flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

var commands = []command{
	{name: "runs", min: 1, max: 1, flags: runsFlags, run: runsCommand, help: `Usage: polyloop-inspect runs [--json] [--status S] [--stop-reason R] [--since T] [--limit N] STORE

Lists the store's runs, newest first (by the time of their first event): run
id, status, steps, tokens, the agent a worker pool runs it for, when it
started, and a finished run's stop reason, the call a run awaiting a person
waits on ("TOOL call ID"), or who holds an unfinished one: "W until T" (the
driver W, its lease until T), "lease of W ran out at T" (W died or stopped),
"-" (never held, or given back); a forked run adds "; forked from RUN@K"
(the source, the step it was forked at). Times are UTC, without the date on the day
of the listing. Status is one of
  finished             the run ended (see stop reason)
  running              a live driver holds it (whatever its log's tail shows)
  awaiting             nobody holds it; it waits for a worker of its agent
  interrupted          nobody holds it: its driver stopped, or died and its lease ran out
  in_doubt             nobody holds it and its log leaves a side effect's outcome unknown
                       (see verify; polyloop-admin resolve settles an action's)
  awaiting_approval    nobody holds it: an action waits for a person's approval
                       (polyloop-admin approve or reject; verify names the call)
  awaiting_resolution  nobody holds it: an action a crash left in doubt waits for an
                       operator's finding (polyloop-admin resolve)
  corrupt              the log breaks a structural rule (see verify)
With --json, one JSON object per run: run_id, status, steps, events,
stop_reason, started, last_event, final_answer, usage (the run's token
counts), pending (the call a run awaits a person for: call, step, awaits,
tool, arguments, arguments_schema, replay_policy, since), agent, owner (the
driver that holds or last held it), lease_expires, failures, last_error,
retry_at (a worker pool's retries), cancel_requested ({by, at}),
forked_from (a fork's origin: run, step, last_key, differences, ancestry),
source_never_actions_after (the never actions the source executed at that
step and after, which the fork does not see), forks ([{run, step}], the
runs forked from this one); null where absent.

Filters:
  --status S        only runs with status S (repeatable: any of them)
  --stop-reason R   only runs that stopped with R (repeatable)
  --since T         only runs started at or after T: an RFC 3339 time, or a
                    duration before now (24h, 90m)
  --limit N         at most N runs (the newest)
Exits 1 when a listed run is corrupt.
`},
	{name: "events", min: 2, max: 2, flags: eventsFlags, run: eventsCommand, help: `Usage: polyloop-inspect events [--json] [--follow] STORE RUN

Prints every event of RUN: ULID, time, kind and a one-line summary (a
decision: the call, the verdict, who, the note, edited arguments, the
observation found), then — without --json or --follow — the call the run
awaits a person for, if any, with the polyloop-admin commands that decide
it, and the run's lineage (as verify gives it). With --json, one JSON
object per line: id, time, kind, schema_version, payload (a fork's
run_started payload has its fork: run, step, last_key, differences, ancestry).
With --follow, keeps printing events as they become durable until the run
finishes (or Ctrl-C). A run not in the store is an error. While nobody
drives the run (awaiting a worker, or interrupted) it says so once on
standard error, and again when a driver takes it, and goes on following. A
PostgreSQL store is followed while agents write, and so is a bbolt file:
through the socket of the process that writes it, which may start after
the follow does. If that process is killed meanwhile, the follow ends with
an error saying it stopped answering (run the command again: it reads the
file); one that closed the store is followed on in the file.
`},
	{name: "steps", min: 2, max: 2, run: stepsCommand, help: `Usage: polyloop-inspect steps [--json] STORE RUN

Prints RUN's trajectory as a table, then the run's usage, the cause of
each env_error, by step, the call the run awaits a person for, if any, and
its lineage (as verify gives it). A fork's trajectory is its own, its
first K steps (those below the step it was forked at) copied from the
source. With --json, JSON Lines with exactly the eighteen StepRecord fields
(absent values are null), readable as is by a data-frame library; for many
runs in one table, see export.
`},
	{name: "verify", min: 1, max: 2, run: verifyCommand, help: `Usage: polyloop-inspect verify [--json] STORE [RUN]

Recovery's verdict for RUN, or for every run: finished (with the final
answer); running (a live driver holds it: in which step, and who); resumable
(nobody holds it: its status, at which breakpoint, what Resume would do, and
who held it last); awaiting_approval or awaiting_resolution (an action waits
for a person: the pending call — tool, arguments, call id, since when — and
the polyloop-admin commands that decide it); or corrupt, with every reason.
For a run in doubt that nobody holds it lists each side effect whose outcome
is unknown (step, kind, tool, result id, replay policy), what Resume would do
with it, and, for an action, the polyloop-admin resolve commands an
operator who knows whether it ran may settle it with (it ran; it did not
run); env_error causes are shown. Then the run's lineage: for a fork,
"forked from RUN at step K", which steps are copied, how its parameters
differ from the source's, and "the source executed N never actions at
step K and after (not seen by this fork)" when it did — those actions
(a payment, a mail) happened in the world; the fork's model does not see
them, and nothing in the fork undoes them; for a run forked from, "forks:
RUN@K, …". Finding a run's forks reads the first event of every run of
the store.
Prints OK or the number of corrupt runs last; exits 1 when any run is
corrupt or RUN is not in the store. With --json, one JSON object per run:
run_id, verdict (finished, running, resumable, awaiting_approval,
awaiting_resolution, corrupt), status, state, step, plan, plan_text,
in_doubt (plan and in_doubt null for a run a driver holds), pending (as runs
--json gives it), problems, stop_reason, final_answer, env_errors, liveness
(who drives it, in words), and the fields runs --json gives from agent on
(forked_from, source_never_actions_after and forks included).
`},
	{name: "serve", min: 1, max: 1, flags: serveFlags, run: serveCommand, help: `Usage: polyloop-inspect serve [--addr 127.0.0.1:8080] STORE

Serves the run viewer over STORE until Ctrl-C: the runs page, a page per
run with its step timeline, and JSON endpoints with the names --json
prints (see package viewer). It listens on the loopback interface unless
--addr says otherwise, and only reads. Both a bbolt file and a PostgreSQL
store are read live while agents write: the file is held only while read,
so an agent starts while it is served, and is read through its socket. A run
awaiting a person shows its pending call; polyloop-admin serve is the
viewer whose pages also record the decisions.
`},
	{name: "export", min: 1, max: 1, flags: exportFlags, run: exportCommand, help: `Usage: polyloop-inspect export [--run RUN]... STORE

Prints the steps of every run (or of each --run) as JSON Lines: one object
per step with run_id first, then the eighteen StepRecord fields — one table
for a data-frame library (pandas.read_json(path, lines=True)). Runs come
oldest first, or in the order of the --run flags; steps in order. A corrupt
run, or one not in the store, is reported on standard error and left out
(exit status 1).
A forked run exports its own trajectory, the steps copied from its source
included, with its own run_id: its rows whose step_idx is below the step it
was forked at (forked_from.step in verify --json, and in its run_started
event) are the source's steps, copied; the rest are its own. The rows keep
the eighteen fields; a copied row also says copied_from, the run the step
first ran in, beside run_id. The source's
never actions at that step and after happened in the world and are in the
source's rows only; the fork's model did not see them.
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
	if args[0] == "--version" || args[0] == "-version" || args[0] == "version" {
		fmt.Fprintln(stdout, buildinfo.Line("polyloop-inspect"))
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

func (cmd command) invoke(args []string, stdout, stderr io.Writer) int {
	c := &call{stdout: stdout, stderr: stderr}
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if cmd.name != "export" && cmd.name != "serve" {
		fs.BoolVar(&c.json, "json", false, "print JSON")
	}
	if cmd.flags != nil {
		cmd.flags(fs, c)
	}
	// Flags may come before or after the positional arguments.
	positional, err := cliflags.Parse(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, cmd.help)
			return exitOK
		}
		fmt.Fprintf(stderr, "polyloop-inspect %s: %v\n\n%s", cmd.name, err, cmd.help)
		return exitUsage
	}
	if len(positional) < cmd.min || len(positional) > cmd.max {
		fmt.Fprintf(stderr, "polyloop-inspect %s: wrong number of arguments\n\n%s", cmd.name, cmd.help)
		return exitUsage
	}
	c.args = positional
	if err := c.filter.check(); err != nil {
		fmt.Fprintf(stderr, "polyloop-inspect %s: %v\n\n%s", cmd.name, err, cmd.help)
		return exitUsage
	}
	return cmd.run(c)
}

// openStore opens a store file or a PostgreSQL connection string
// read-only, waiting a bounded time for a bbolt file's writer. It reports a
// failure itself, in the words of stores.Explain.
func (c *call) openStore(target string) (stores.Store, bool) {
	s, err := stores.Open(context.Background(), target, stores.Options{ReadOnly: true, LockTimeout: lockWait})
	switch {
	case errors.Is(err, kv.ErrLocked):
		c.fail("%s; stop the writer or retry", escape(stores.Explain(target, err).Error()))
		return nil, false
	case err != nil:
		c.fail("%s", escape(stores.Explain(target, err).Error()))
		return nil, false
	}
	return s, true
}

// store names the command's store for a message: a file's absolute path,
// a connection string without its password (stores.Describe).
func (c *call) store() string { return escape(stores.Describe(c.args[0])) }

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

// clip escapes s and shortens it to n runes (report.Clip).
func clip(s string, n int) string { return report.Clip(escape(s), n) }

func stamp(t time.Time) string { return report.Stamp(t) }
