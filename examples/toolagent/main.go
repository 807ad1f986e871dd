// Command toolagent is a phased document-review agent in PolyLoop: JSON
// Schema tools in one registry, a different RestrictTo subset per phase, a
// submit tool marked completes_run, reads marked safe and writes (findings,
// summaries) marked never. Each phase is its own run; the review phase reads
// the triage phase's submitted summary back from the results file.
//
// Offline by default (scripted models); with -url it talks to any
// OpenAI-compatible endpoint. -crash-after N stops the process after N
// durable writes, as a crash would; -resume continues where it stopped:
//
//	go run ./examples/toolagent -crash-after 9
//	go run ./examples/toolagent -resume
//
// -fork-from PREFIX/PHASE -at STEP starts the phase PHASE of the review
// -run as a fork of that stored phase run at step STEP (engine.Fork): its
// log begins with the source's steps below STEP, and it goes on under this
// invocation's flags (another -url or -model); the phases after it run as
// new runs of the review -run, and the phases before it are the source's
// (a forked review phase reads PREFIX's triage summary). The findings
// listed are the fork's own: the copied steps' are the source's.
//
//	go run ./examples/toolagent -run review-2 -fork-from review-1/triage -at 2
//
// Exit status: 0 the review completed, 1 an error (a fork refused: a step
// beyond the source's end, the fork's run taken, the source not found), 3
// a crash on purpose, 130 interrupted (Ctrl-C, at a step boundary) or a
// phase's run cancelled.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"github.com/polyloop/polyloop/crashstore"
	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/openai"
	"github.com/polyloop/polyloop/parsers"
	"github.com/polyloop/polyloop/progress"
	"github.com/polyloop/polyloop/scripted"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/stores"
)

// phase is one run of the review.
type phase struct {
	name   string
	tools  []string
	goal   func(d resultData, triage string) string // triage: the triage phase's run id
	script []string                                 // the offline model's replies
}

var phases = []phase{
	{
		name:  "triage",
		tools: []string{"list_documents", "read_document", "submit"},
		goal: func(resultData, string) string {
			return "List the documents, read each, and submit the ids of those that need a legal review, comma-separated."
		},
		script: []string{
			`{"tool":"list_documents","arguments":{}}`,
			`{"tool":"read_document","arguments":{"id":"lease-2024"}}`,
			`{"tool":"read_document","arguments":{"id":"nda-acme"}}`,
			`{"tool":"read_document","arguments":{"id":"supply-beta"}}`,
			`Two of them look risky. {"tool":"submit","arguments":{"summary":"lease-2024,nda-acme"}}`,
		},
	},
	{
		name:  "review",
		tools: []string{"read_document", "flag_issue", "submit"},
		goal: func(d resultData, triage string) string {
			return "Review these documents and flag every risky clause, then submit a one-line summary: " + d.Summaries[triage]
		},
		script: []string{
			`{"tool":"read_document","arguments":{"id":"lease-2024"}}`,
			`{"tool":"flag_issue","arguments":{"document":"lease-2024","clause":3,"severity":"high","note":"termination without notice"}}`,
			`{"tool":"read_document","arguments":{"id":"nda-acme"}}`,
			`{"tool":"flag_issue","arguments":{"document":"nda-acme","clause":2,"severity":"medium","note":"no liability cap"}}`,
			`Severity must be low or high. {"tool":"flag_issue","arguments":{"document":"nda-acme","clause":2,"severity":"high","note":"no liability cap"}}`,
			`{"tool":"submit","arguments":{"summary":"2 high-severity issues in 2 documents"}}`,
		},
	},
}

var runPrefix = "review-1"

type config struct {
	steps                      io.Writer // where a line per step goes as it becomes durable (nil: nowhere)
	store, results, url, model string
	resume                     bool
	crashAfter                 int
	// forkFrom, when set, names the phase run (PREFIX/PHASE) that the
	// review's PHASE forks at step at.
	forkFrom string
	at       int
	// interrupt, once closed, stops the running phase at its next step
	// boundary, resumable (Ctrl-C).
	interrupt <-chan struct{}
}

func main() {
	var c config
	flag.StringVar(&c.store, "store", "toolagent.db", "bbolt store file or postgres:// URL")
	flag.StringVar(&c.results, "results", "toolagent-results.json", "results file (the consumer's database)")
	flag.StringVar(&runPrefix, "run", runPrefix, "run id prefix; phases append /triage and /review")
	flag.StringVar(&c.url, "url", "", "OpenAI-compatible base URL; empty: scripted models")
	flag.StringVar(&c.model, "model", "qwen2.5", "model name for -url")
	flag.BoolVar(&c.resume, "resume", false, "resume an interrupted review")
	flag.IntVar(&c.crashAfter, "crash-after", -1, "exit abruptly after this many durable writes (to try -resume)")
	flag.StringVar(&c.forkFrom, "fork-from", "", "fork this stored phase run (PREFIX/PHASE) at step -at as the review -run's PHASE, under these flags")
	flag.IntVar(&c.at, "at", 0, "the step -fork-from forks at: the fork copies the source's steps below it")
	flag.Parse()
	// Ctrl-C stops the running phase at its next step boundary, unfinished
	// and resumable (-resume continues it), as a crash would but with
	// nothing in doubt. (Cancelling a run — polyloop-admin cancel —
	// finishes it.)
	interrupted, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	context.AfterFunc(interrupted, stop) // a second Ctrl-C kills at once
	c.interrupt = interrupted.Done()
	err := review(context.Background(), c, os.Stdout)
	switch {
	case errors.Is(err, engine.ErrInterrupted):
		fmt.Fprintln(os.Stderr, "toolagent: interrupted at a step boundary; continue with -resume")
		os.Exit(130)
	case errors.Is(err, crashstore.ErrCrashed):
		fmt.Fprintln(os.Stderr, "toolagent: crashed on purpose after", c.crashAfter, "durable writes; continue with -resume")
		os.Exit(3)
	case errors.Is(err, errCancelled):
		fmt.Fprintln(os.Stderr, "toolagent:", err)
		os.Exit(130)
	case err != nil:
		fmt.Fprintln(os.Stderr, "toolagent:", err)
		os.Exit(1)
	}
}

// errCancelled: a phase's run was cancelled.
var errCancelled = errors.New("the phase's run was cancelled (recorded; it will not resume)")

// review runs (or, resuming, continues) each phase in turn.
func review(ctx context.Context, c config, out io.Writer) error {
	c.steps = out
	first, err := forkedPhase(c)
	if err != nil {
		return err
	}
	store, err := stores.Open(ctx, c.store, stores.Options{})
	if err != nil {
		return err
	}
	defer store.Close()
	db := &results{path: c.results}
	all, err := tools(db)
	if err != nil {
		return err
	}
	var runStore seams.RunStore = store
	if c.crashAfter >= 0 {
		runStore = &crashstore.Store{Inner: store, After: c.crashAfter}
	}
	for i, p := range phases[first:] {
		r, err := runPhase(ctx, p, all, db, runStore, c)
		if err != nil {
			return fmt.Errorf("phase %s: %w", p.name, err)
		}
		if i == 0 && c.forkFrom != "" {
			fmt.Fprintf(out, "%s/%s forked from %s at step %d\n", runPrefix, p.name, c.forkFrom, c.at)
		}
		fmt.Fprintf(out, "phase %s: %s after %d steps; %s\n", p.name, r.StopReason, len(r.Steps), r.Usage)
		if r.StopReason == events.StopCancelled {
			return fmt.Errorf("phase %s: %w", p.name, errCancelled)
		}
		if r.StopReason != events.StopTaskCompleted {
			return fmt.Errorf("phase %s did not complete (%s)", p.name, r.StopReason)
		}
	}
	d, err := db.load()
	if err != nil {
		return err
	}
	for _, f := range d.Findings {
		if strings.HasPrefix(f.RunID, runPrefix+"/") { // this review's, not another's in the same file
			fmt.Fprintf(out, "finding: %s clause %d [%s] %s\n", f.Document, f.Clause, f.Severity, f.Note)
		}
	}
	fmt.Fprintf(out, "summary: %s\n", d.Summaries[runPrefix+"/review"])
	return nil
}

// forkedPhase checks the fork flags and returns the index of the phase
// the review begins with: the forked one, or the first.
func forkedPhase(c config) (int, error) {
	switch {
	case c.forkFrom == "" && c.at != 0:
		return 0, fmt.Errorf("-at %d: a step to fork at needs -fork-from PREFIX/PHASE", c.at)
	case c.forkFrom == "":
		return 0, nil
	case c.resume:
		return 0, errors.New("-fork-from starts a new run and -resume continues one: give one of them")
	case c.crashAfter >= 0:
		return 0, errors.New("-fork-from with -crash-after: the crashing store does not fork runs; fork first, then go on with -resume and -crash-after")
	}
	name := c.forkFrom[strings.LastIndex(c.forkFrom, "/")+1:]
	for i, p := range phases {
		if strings.HasSuffix(c.forkFrom, "/"+p.name) {
			return i, nil
		}
	}
	return 0, fmt.Errorf("-fork-from %q: want a phase's run, PREFIX/triage or PREFIX/review (phase %q)", c.forkFrom, name)
}

// triageRun is the run id of the triage phase the review phase reads:
// the source's when the review phase is a fork, else this review's.
func triageRun(c config) string {
	if strings.HasSuffix(c.forkFrom, "/review") {
		return strings.TrimSuffix(c.forkFrom, "/review") + "/triage"
	}
	return runPrefix + "/triage"
}

func runPhase(ctx context.Context, p phase, all *seams.Registry, db *results, store seams.RunStore, c config) (events.RunResult, error) {
	reg, err := all.RestrictTo(p.tools...)
	if err != nil {
		return events.RunResult{}, err
	}
	d, err := db.load()
	if err != nil {
		return events.RunResult{}, err
	}
	var model seams.ModelClient = &scripted.Model{Turns: scripted.Replies(p.script...)}
	if c.url != "" {
		if model, err = openai.New(openai.Options{BaseURL: c.url, Model: c.model}); err != nil {
			return events.RunResult{}, err
		}
	}
	def := engine.Definition{Model: model, Parser: parsers.ToolCalls{}, Store: store, Interrupt: c.interrupt}
	if c.steps != nil {
		def.Events = progress.New(c.steps) // a line per step as it becomes durable
	}
	req := engine.Request{
		RunID:             runPrefix + "/" + p.name,
		Budget:            engine.Budget{MaxSteps: 15, MaxActions: 12, MaxConsecutiveParseFailures: 3, MaxPromptChars: 80_000},
		Tools:             reg,
		Executor:          reg.Executor(),
		ModelReplayPolicy: events.ReplaySafe,
		Context: engine.Context{
			RunLevel: []seams.Message{seams.Text(seams.RoleSystem,
				`You review contracts. Answer with exactly one JSON object per reply: {"tool": "<name>", "arguments": {...}}.`)},
			GoalLevel: []seams.Message{seams.Text(seams.RoleUser, p.goal(d, triageRun(c)))},
		},
		ObservationTemplate: "Tool result: {observation}",
	}
	if c.forkFrom != "" && strings.HasSuffix(c.forkFrom, "/"+p.name) {
		r, err := engine.Fork(ctx, def, req, c.forkFrom, c.at)
		switch {
		case errors.Is(err, engine.ErrForkStep):
			err = fmt.Errorf("run %q has no step %d to fork at: %w", c.forkFrom, c.at, err)
		case errors.Is(err, engine.ErrRunExists), errors.Is(err, engine.ErrInvalidRequest) && req.RunID == c.forkFrom:
			err = fmt.Errorf("run %q exists in %s: a fork needs a new review (-run NAME): %w", req.RunID, stores.Describe(c.store), err)
		case errors.Is(err, engine.ErrRunNotFound):
			err = fmt.Errorf("no run %q to fork in %s: %w", c.forkFrom, stores.Describe(c.store), err)
		}
		return r, err
	}
	if !c.resume {
		r, err := engine.Run(ctx, def, req)
		if errors.Is(err, engine.ErrRunExists) {
			err = fmt.Errorf("%w: continue it with -resume, or start another review with -run NAME", err)
		}
		return r, err
	}
	r, err := engine.Resume(ctx, def, req)
	if errors.Is(err, engine.ErrRunNotFound) && p.name != phases[0].name {
		// A review interrupted before this phase began: begin it now.
		prev := runPrefix + "/" + phases[0].name
		if stream, lerr := store.Load(ctx, prev); lerr == nil && len(stream) > 0 {
			return engine.Run(ctx, def, req)
		}
	}
	if errors.Is(err, engine.ErrRunNotFound) {
		err = fmt.Errorf("%w: there is no review %q to resume in %s; start it without -resume", err, runPrefix, c.store)
	}
	return r, err
}
