package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/polyloop/polyloop/cmd/internal/buildinfo"
	"github.com/polyloop/polyloop/cmd/internal/cliflags"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/retention"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/stores"
)

const (
	exitOK      = 0
	exitProblem = 1
	exitUsage   = 2
)

const usage = `polyloop-admin changes PolyLoop stores: cancels and resumes runs, records
people's decisions on calls that await them (from the command line or the
run viewer's pages), deletes runs, compacts files. (polyloop-inspect only
reads.)

Usage:
  polyloop-admin cancel [--by NAME] STORE RUN...    cancel runs, whoever drives them
  polyloop-admin resume STORE RUN...                hand interrupted runs back to the workers now
  polyloop-admin approve [--by NAME] [--note TEXT] [--arguments JSON] STORE RUN CALL
                                                    approve a call awaiting approval (edited arguments: a JSON object)
  polyloop-admin reject [--by NAME] [--note TEXT] STORE RUN CALL
                                                    reject it: it never runs, the model is told the note
  polyloop-admin resolve [--by NAME] [--note TEXT] (--executed --observation TEXT | --not-executed) STORE RUN CALL
                                                    say whether an action a crash left in doubt ran
  polyloop-admin serve [--addr ADDR] [--hosts H,…] --by NAME STORE
                                                    the run viewer, recording the decisions made on its pages by NAME
  polyloop-admin delete [--force] [--dry-run] [--json] STORE RUN...
                                                    delete runs (finished ones; --force: unfinished too)
  polyloop-admin gc --finished-before DUR [--dry-run] [--json] STORE
                                                    delete finished runs whose last event is older than DUR (720h)
  polyloop-admin compact STORE                      rewrite a bbolt file without its free pages (an old file comes out in the current format)
  polyloop-admin fork [--reply TEXT]... STORE SOURCE STEP NEWID
                                                    fork a polyloop-demo run at STEP onto the new run NEWID
  polyloop-admin --version                          the module version and VCS revision it was built from

STORE is a bbolt file or a PostgreSQL connection string (a postgres:// URL
or a key=value string; a password in it is never printed).

cancel records a request to cancel each run, by NAME (user@host unless
--by says): the driver that holds a run ends it cancelled before its next
model call or side effect; a run nobody holds is ended here at once (a
side effect its log leaves in doubt stays so, and is named). resume hands
a run started for an agent, that nobody drives, back to the workers at
once: its retry time, failure count and last error are cleared. A bbolt
file is changed only while no other process has it open.

approve, reject and resolve record a decision by NAME (user@host unless
--by says) on CALL, the id of a call that waits for one ("polyloop-inspect
runs --status awaiting_approval STORE" lists the runs, "polyloop-inspect
verify STORE RUN" names the call). An approved call runs once when the run
goes on — with --arguments in place of the model's, checked against the
tool's schema; a rejected one never runs, and the model is told "rejected
by reviewer: NOTE". resolve settles an action whose outcome a crash left in
doubt, which would otherwise end the run resume_state_unknown: it ran
(--executed, --observation what you saw of its effect, which the model is
told) or not (--not-executed); either way it is not run again. The run
goes on when its program resumes it, or at once with the workers of its
agent.

serve serves the run viewer over STORE until Ctrl-C (polyloop-inspect
serve is the read-only one), listening on 127.0.0.1:8080 unless --addr
says otherwise, and records the decisions made on its pages by NAME: a
run awaiting approval gets approve (with a note, and edited arguments the
tool's schema must accept) and reject buttons; an action awaiting a
resolution, or left in doubt, on a run nobody drives gets resolve
(executed, with what was seen; not executed). They are refused as approve,
reject and resolve are; the buttons carry a secret token and requests from
another site are refused. It answers only to localhost and loopback
addresses unless --hosts names the others the pages are reached by (host
or host:port, comma-separated); a request to any other name is refused
(421), as a page whose DNS name was rebound to this address would be. A
bbolt file is held for writing while it is served.

fork starts NEWID from SOURCE's first STEP steps (0 up to the steps it
completed), copied — nothing in them runs again — under polyloop-demo's
agent (its tools, parser and prompt), its model replying the --reply
texts in order from step STEP on (polyloop-demo's script when none is
given). The fork's first event says where it came from and how its
parameters differ from the source's (recorded, not refused);
polyloop-inspect and the viewer show "forked from SOURCE at step STEP".
The source's never actions at STEP and after (a payment, a mail) happened
in the world; the fork's model does not see them, and nothing undoes them.
A fork is refused, writing nothing, when STEP is beyond the source's
completed steps, NEWID exists, SOURCE is not in the store or is corrupt,
or the store does not fork runs. Runs of another agent are forked with
engine.Fork in the program that can rebuild their definition.

A run being driven is never deleted; gc leaves damaged runs alone and
names them. delete and gc name each run they delete ("deleted RUN"), and
each they leave alone on stderr with why (not in the store, held by a
driver, not finished, damaged); gc then counts them. --dry-run says the
same of what they would delete ("would delete RUN"), from the store's
listing, opened read-only as polyloop-inspect opens it, and writes
nothing. --json prints one object per run instead:
{"run_id", "action": deleted, would_delete, skipped or error (the store
failed), "reason" when skipped or error}. Exit status: 0 done, 1 a problem (a run refused — finished,
unknown, held, not an agent's — or damaged; a decision refused — no such
call, a call that awaits no such decision or is decided already, edited
arguments the tool's schema refuses, a run driven meanwhile; the store
missing or unreadable, a store that keeps no cancel requests or no
queue), 2 bad usage.
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	force := fs.Bool("force", false, "delete unfinished runs too")
	dryRun := fs.Bool("dry-run", false, "delete, gc: say what would be deleted, deleting nothing")
	asJSON := fs.Bool("json", false, "delete, gc: one JSON object per run")
	before := fs.Duration("finished-before", 0, "age of the runs gc deletes")
	by := fs.String("by", "", "who cancels or decides (default user@host)")
	note := fs.String("note", "", "a decision's note")
	arguments := fs.String("arguments", "", "an approval's edited arguments, a JSON object")
	executed := fs.Bool("executed", false, "resolve: the action ran")
	notExecuted := fs.Bool("not-executed", false, "resolve: the action did not run")
	observation := fs.String("observation", "", "resolve --executed: what was seen of its effect")
	addr := fs.String("addr", "127.0.0.1:8080", "serve: the address to listen on (loopback unless you say otherwise)")
	hosts := fs.String("hosts", "", "serve: the host names (host or host:port, comma-separated) the pages are reached by (default: localhost and loopback addresses)")
	var replies multiFlag
	fs.Var(&replies, "reply", "fork: the model's reply from step STEP on (repeatable, in order)")
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "polyloop-admin %s: "+format+"\n\n%s", append([]any{args[0]}, append(a, usage)...)...)
		return exitUsage
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	case "--version", "-version", "version":
		fmt.Fprintln(stdout, buildinfo.Line("polyloop-admin"))
		return exitOK
	case "cancel", "resume", "delete", "gc", "compact", "approve", "reject", "resolve", "serve", "fork":
	default:
		return bad("unknown command")
	}
	pos, err := cliflags.Parse(fs, args[1:])
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	if err != nil {
		return bad("%v", err)
	}
	// One flag set serves the commands; each takes its own flags only.
	own := map[string][]string{"delete": {"force", "dry-run", "json"}, "gc": {"finished-before", "dry-run", "json"}, "cancel": {"by"},
		"approve": {"by", "note", "arguments"}, "reject": {"by", "note"},
		"resolve": {"by", "note", "executed", "not-executed", "observation"},
		"serve":   {"by", "addr", "hosts"}, "fork": {"reply"}}[args[0]]
	var stray string
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) {
		set[f.Name] = true
		if !slices.Contains(own, f.Name) {
			stray = f.Name
		}
	})
	if stray != "" {
		return bad("--%s is not a flag of %s", stray, args[0])
	}
	if (args[0] == "cancel" || args[0] == "resume") && len(pos) < 2 {
		return bad("want STORE and at least one RUN")
	}
	var d events.Decision // approve's, reject's or resolve's
	if args[0] == "approve" || args[0] == "reject" || args[0] == "resolve" {
		if d, err = decision(args[0], decisionFlags{by, note, arguments, observation, executed, notExecuted}, set, pos); err != nil {
			return bad("%v", err)
		}
	}
	if args[0] == "serve" {
		switch {
		case len(pos) != 1:
			return bad("want one STORE")
		case *by == "":
			// An audit record names a person: no guessed default.
			return bad("--by NAME is needed: who the decisions made on the pages are recorded as")
		}
	}
	step := 0
	if args[0] == "fork" {
		if len(pos) != 4 {
			return bad("want STORE SOURCE STEP NEWID")
		}
		if step, err = forkStep(pos[2]); err != nil {
			return bad("%v", err)
		}
	}
	if len(pos) > 0 && !stores.IsPostgres(pos[0]) {
		// Opening creates a missing file: a mistyped path would be
		// "cleaned" as an empty store.
		if _, err := os.Stat(pos[0]); err != nil {
			fmt.Fprintf(stderr, "polyloop-admin: %v\n", stores.Explain(pos[0], err))
			return exitProblem
		}
	}
	ctx := context.Background()
	switch args[0] {
	case "approve", "reject", "resolve":
		s, code := open(ctx, pos[0], false, stderr)
		if s == nil {
			return code
		}
		defer s.Close()
		return decide(ctx, s, stores.Describe(pos[0]), args[0], d, stdout, stderr)
	case "fork":
		s, code := open(ctx, pos[0], false, stderr)
		if s == nil {
			return code
		}
		defer s.Close()
		return forkRun(ctx, s, stores.Describe(pos[0]), pos[1], step, pos[3], replies, stdout, stderr)
	case "serve":
		s, code := open(ctx, pos[0], false, stderr)
		if s == nil {
			return code
		}
		defer s.Close()
		return serve(s, stores.Describe(pos[0]), *addr, *by, hostList(*hosts), stdout, stderr)
	case "cancel", "resume":
		if args[0] == "cancel" && *by == "" {
			*by = operator()
		}
		s, code := open(ctx, pos[0], false, stderr)
		if s == nil {
			return code
		}
		defer s.Close()
		if args[0] == "cancel" {
			return cancelRuns(ctx, s, stores.Describe(pos[0]), *by, pos[1:], stdout, stderr)
		}
		return resumeRuns(ctx, s, stores.Describe(pos[0]), pos[1:], stdout, stderr)
	case "delete":
		if len(pos) < 2 {
			return bad("want STORE and at least one RUN")
		}
		return withStore(ctx, pos[0], *dryRun, stderr, func(r seams.RunReader, w retention.Store) int {
			return deleteRuns(ctx, r, w, newOutcomes("delete", stores.Describe(pos[0]), *asJSON, stdout, stderr), pos[1:], *force)
		})
	case "gc":
		if len(pos) != 1 || *before <= 0 {
			return bad("want --finished-before DURATION (e.g. 720h) and one STORE")
		}
		return withStore(ctx, pos[0], *dryRun, stderr, func(r seams.RunReader, w retention.Store) int {
			return gc(ctx, r, w, newOutcomes("gc", stores.Describe(pos[0]), *asJSON, stdout, stderr), *before)
		})
	}
	if len(pos) != 1 {
		return bad("want one STORE")
	}
	if stores.IsPostgres(pos[0]) {
		fmt.Fprintln(stderr, "polyloop-admin compact: PostgreSQL reclaims deleted rows itself (autovacuum); VACUUM FULL the schema's tables to give the space back to the disk")
		return exitProblem
	}
	res, err := kv.Compact(pos[0], kv.Options{LockTimeout: 2 * time.Second})
	if err != nil {
		return openFailed(pos[0], err, stderr)
	}
	fmt.Fprintf(stdout, "compacted %s: %d bytes -> %d bytes\n", pos[0], res.Before, res.After)
	return exitOK
}

// heldAdvice follows the error of a command that writes a bbolt file
// another process holds.
const heldAdvice = "stop the process that writes it first: a bbolt file is changed by that process (engine.Cancel, engine.Decide, engine.Resolve, worker.Pool.Resume, retention.Expire, kv.Store.DeleteRun) or while none does (polyloop-inspect reads it meanwhile)"

// open opens target read-write, or for reading only, reporting a failure
// itself (then the store is nil and the exit status says the problem).
func open(ctx context.Context, target string, readOnly bool, stderr io.Writer) (stores.Store, int) {
	s, err := stores.Open(ctx, target, stores.Options{ReadOnly: readOnly, LockTimeout: 2 * time.Second})
	if err != nil {
		return nil, openFailed(target, err, stderr)
	}
	return s, exitOK
}

// openFailed says why target could not be opened (stores.Explain), with
// what to do about a file another process holds, and returns exitProblem.
func openFailed(target string, err error, stderr io.Writer) int {
	if errors.Is(err, kv.ErrLocked) {
		fmt.Fprintf(stderr, "polyloop-admin: %v; %s\n", stores.Explain(target, err), heldAdvice)
		return exitProblem
	}
	fmt.Fprintf(stderr, "polyloop-admin: %v\n", stores.Explain(target, err))
	return exitProblem
}

// withStore opens target and runs f on it: read-write for f to delete
// with w, or for a dry run read-only, w nil — a dry run reads the store's
// listing (retention.Check, retention.Preview) and must not change it
// (a read-write open migrates an empty PostgreSQL schema and upgrades a
// bbolt file of an older format).
func withStore(ctx context.Context, target string, dryRun bool, stderr io.Writer, f func(r seams.RunReader, w retention.Store) int) int {
	s, code := open(ctx, target, dryRun, stderr)
	if s == nil {
		return code
	}
	defer s.Close()
	if dryRun {
		return f(s, nil)
	}
	rs, ok := s.(retention.Store)
	if !ok {
		fmt.Fprintf(stderr, "polyloop-admin: %s cannot delete runs\n", stores.Describe(target))
		return exitProblem
	}
	return f(rs, rs)
}
