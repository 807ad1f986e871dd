package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/polyloop/polyloop/report"
	"github.com/polyloop/polyloop/retention"
	"github.com/polyloop/polyloop/seams"
)

// outcome is what delete or gc did, or would do, to one run: a line of
// --json.
type outcome struct {
	Run    string `json:"run_id"`
	Action string `json:"action"` // deleted, would_delete, skipped or error
	Reason string `json:"reason,omitempty"`
}

// The actions of an outcome.
const (
	actionDeleted     = "deleted"
	actionWouldDelete = "would_delete"
	actionSkipped     = "skipped"
	actionError       = "error" // the store failed (no refusal); the reason is its error
)

// outcomes prints what delete and gc did to each run: a line to stdout
// per run deleted (or that would be), a refusal to stderr per run
// skipped; with --json, one object per run to stdout.
type outcomes struct {
	stdout, stderr io.Writer
	verb           string // delete or gc, naming the refusals
	store          string // the store, as messages name it
	json           *json.Encoder
}

func newOutcomes(verb, store string, asJSON bool, stdout, stderr io.Writer) *outcomes {
	o := &outcomes{stdout: stdout, stderr: stderr, verb: verb, store: store}
	if asJSON {
		o.json = json.NewEncoder(stdout)
		o.json.SetEscapeHTML(false)
	}
	return o
}

// done says a run was deleted, or would be by a dry run.
func (o *outcomes) done(id string, dryRun bool) {
	action, words := actionDeleted, "deleted"
	if dryRun {
		action, words = actionWouldDelete, "would delete"
	}
	if o.json != nil {
		o.json.Encode(outcome{Run: id, Action: action})
		return
	}
	fmt.Fprintf(o.stdout, "%s %s\n", words, id)
}

// skipped says why a run was left alone: reason for --json, sentence for
// the text on stderr (which names the run itself).
func (o *outcomes) skipped(id, reason, sentence string) {
	if o.json != nil {
		o.json.Encode(outcome{Run: id, Action: actionSkipped, Reason: reason})
		return
	}
	fmt.Fprintf(o.stderr, "polyloop-admin: %s: %s\n", o.verb, sentence)
}

// failed says a run's deletion failed with err, an error that is no
// refusal (a disk, a connection): with --json, an object whose action is
// "error" and whose reason is err.
func (o *outcomes) failed(id string, err error) {
	if o.json != nil {
		o.json.Encode(outcome{Run: id, Action: actionError, Reason: err.Error()})
		return
	}
	fmt.Fprintf(o.stderr, "polyloop-admin: %v\n", err)
}

// refused says a DeleteRun refusal err (or retention.Check's) of run id
// once, in words: the run not in the store, held by a driver (named, as
// s lists it), unfinished, or damaged (with the damage the store names).
// It reports false for an error that is no refusal.
func (o *outcomes) refused(ctx context.Context, s seams.RunReader, id string, err error) bool {
	quoted := fmt.Sprintf("%q", report.Clip(id, 80))
	switch {
	case errors.Is(err, seams.ErrNoRun), errors.Is(err, seams.ErrInvalidRunID):
		o.skipped(id, "no such run", fmt.Sprintf("no run %s in %s", quoted, o.store))
	case errors.Is(err, seams.ErrRunLocked):
		held := "held by a driver"
		if h := holder(ctx, s, id); h != "" {
			held += " (" + h + ")"
		}
		o.skipped(id, held, fmt.Sprintf("run %s is %s; left alone", quoted, held))
	case errors.Is(err, seams.ErrRunNotFinished) && damage(err) != "":
		reason := "damaged: " + damage(err) + " (polyloop-inspect verify says how; --force deletes it)"
		o.skipped(id, reason, fmt.Sprintf("run %s is %s", quoted, reason))
	case errors.Is(err, seams.ErrRunNotFinished):
		reason := "not finished (it may be resumed); --force deletes it"
		o.skipped(id, reason, fmt.Sprintf("run %s is %s", quoted, reason))
	default:
		return false
	}
	return true
}

// holder names who holds run id as the store s lists it ("W until T"),
// "" when s cannot say (it is no seams.RunReader, or lists no holder: a
// PostgreSQL store lists none for a finished run).
func holder(ctx context.Context, s any, id string) string {
	r, ok := s.(seams.RunReader)
	if !ok {
		return ""
	}
	if info, err := report.Describe(ctx, r, id); err == nil && info.Owner != "" {
		if h := report.Holder(seams.StatusRunning, info, time.Now()); h != "-" {
			return h
		}
	}
	return ""
}

// damage is the damage a store joins to its refusal to delete a damaged
// run without force (seams.ErrRunNotFinished beside the damage, as kv's,
// pgstore's and retention.Check's refusals have it), "" when err names
// none.
func damage(err error) string {
	for err != nil {
		if joined, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range joined.Unwrap() {
				if e != seams.ErrRunNotFinished {
					return e.Error()
				}
			}
			return ""
		}
		err = errors.Unwrap(err)
	}
	return ""
}

// deleteRuns deletes the runs ids with w (with force, unfinished ones
// too), or, a dry run with w nil, says which it would from r's listing,
// deleting nothing. A run refused makes the exit status 1.
func deleteRuns(ctx context.Context, r seams.RunReader, w retention.Store, o *outcomes, ids []string, force bool) int {
	code, dryRun := exitOK, w == nil
	for _, id := range ids {
		var err error
		if dryRun {
			err = retention.Check(ctx, r, id, force)
		} else {
			err = w.DeleteRun(ctx, id, force)
		}
		switch {
		case err == nil:
			o.done(id, dryRun)
			continue
		case !o.refused(ctx, r, id, err):
			o.failed(id, err)
		}
		code = exitProblem
	}
	return code
}

// gc deletes with w the finished runs whose last event is older than age
// (retention.Expire), or, a dry run with w nil, says which it would from
// r's listing (retention.Preview), naming each run, then the count. A
// damaged run, or a failure, makes the exit status 1; a run held by a
// driver is left for the next pass.
func gc(ctx context.Context, r seams.RunReader, w retention.Store, o *outcomes, age time.Duration) int {
	dryRun, cutoff := w == nil, time.Now().Add(-age)
	var res retention.Result
	var err error
	words := "deleted"
	if dryRun {
		res, err = retention.Preview(ctx, r, cutoff)
		words = "would delete"
	} else {
		res, err = retention.Expire(ctx, w, cutoff)
	}
	for _, id := range res.Deleted {
		o.done(id, dryRun)
	}
	if o.json == nil {
		fmt.Fprintf(o.stdout, "%s %s older than %s", words, report.Plural(len(res.Deleted), "finished run"), age)
		if len(res.Busy) > 0 {
			fmt.Fprintf(o.stdout, "; %d held by a driver, left for the next pass", len(res.Busy))
		}
		fmt.Fprintln(o.stdout)
	}
	for _, id := range res.Busy {
		reason := "held by a driver; left for the next pass"
		o.skipped(id, reason, fmt.Sprintf("run %q is %s", report.Clip(id, 80), reason))
	}
	for _, id := range res.Damaged {
		o.skipped(id, "damaged (polyloop-inspect verify says how)",
			fmt.Sprintf("run %q is damaged and was left alone (polyloop-inspect verify says how)", report.Clip(id, 80)))
	}
	if err != nil {
		fmt.Fprintf(o.stderr, "polyloop-admin: %v\n", err)
		return exitProblem
	}
	if len(res.Damaged) > 0 {
		return exitProblem
	}
	return exitOK
}
