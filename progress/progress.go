// Package progress prints a run's steps as they become durable: an
// seams.EventSink (Definition.Events) that writes one line per completed
// step — run, step, action, status, tokens — so a long run shows what it
// does while it does it, not only its result at the end. polyloop-demo
// and the examples use it; a consumer's program can too.
//
// It folds each run's events with recovery.Fold, the fold the engine and
// the readers share: a step's tokens are its model reply's, as
// polyloop-inspect steps shows them. A sink sees only the events written
// while it is attached, so after a Resume a step whose reply was written
// before shows no tokens ("-").
//
// What does not live here: reading stored runs (package report,
// polyloop-inspect) and traces (package otelsink).
package progress

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/recovery"
	"github.com/polyloop/polyloop/report"
)

// Printer is an seams.EventSink writing a line per completed step to its
// writer. One Printer may serve many runs at once (a worker pool's): each
// line names its run. Text a model wrote is quoted, so it never drives
// the terminal.
type Printer struct {
	mu   sync.Mutex
	w    io.Writer
	runs map[string]*recovery.Fold
}

// New returns a Printer writing to w.
func New(w io.Writer) *Printer { return &Printer{w: w, runs: map[string]*recovery.Fold{}} }

// Emit implements seams.EventSink: it folds e and, when e completes a
// step, writes the step's line. A write error is returned (the engine
// counts it in RunResult.EventDeliveryFailures; the run goes on).
func (p *Printer) Emit(_ context.Context, e events.Envelope) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	id := events.RunIDOf(e.Event)
	f := p.runs[id]
	if f == nil {
		f = new(recovery.Fold)
		p.runs[id] = f
	}
	var line string
	if step, ok := events.As[events.StepCompleted](e.Event); ok {
		line = Line(id, step.Step, f.Current.Reply)
	}
	f.Apply(e.Event)
	if f.Finished != nil {
		delete(p.runs, id)
	}
	if line == "" {
		return nil
	}
	_, err := io.WriteString(p.w, line+"\n")
	return err
}

// Parameters implements seams.EventSink: printing changes nothing a run
// does.
func (p *Printer) Parameters() map[string]string { return nil }

// Line is a completed step's line: "RUN step N: ACTION -> STATUS, T
// tokens". ACTION is the tool and its arguments, the action's text, "final
// answer", or "reply not parsed: ERROR"; STATUS the action's status ("-"
// for none); T the tokens of reply, the step's model reply ("-" when it
// reported none or is not known).
func Line(runID string, s events.StepRecord, reply *events.ModelReply) string {
	var action string
	switch {
	case s.ToolName != nil:
		args := ""
		if s.ToolArguments != nil {
			args = " " + quote(*s.ToolArguments)
		}
		action = "tool " + *s.ToolName + args
	case s.Action != nil:
		action = "action " + quote(*s.Action)
	case !s.ParseOK && s.ParseError != nil:
		action = "reply not parsed: " + quote(*s.ParseError)
	case !s.ParseOK:
		action = "reply not parsed"
	default:
		action = "final answer"
	}
	status := "-"
	if s.ActionStatus != nil {
		status = string(*s.ActionStatus)
	}
	tokens := "-"
	if reply != nil && reply.Usage != nil {
		var t events.UsageTotals
		t.Add(reply.Usage)
		tokens = fmt.Sprint(t.Total())
	}
	return fmt.Sprintf("%s step %d: %s -> %s, %s tokens", quote(runID), s.StepIdx, action, status, tokens)
}

// quote is s shortened to 60 runes (report.Clip), as it is when every
// rune of it is printable (strconv.IsPrint), Go-quoted otherwise: control
// and format characters escaped, so text a model wrote cannot drive a
// terminal.
func quote(s string) string {
	s = report.Clip(s, 60)
	for _, r := range s {
		if !strconv.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}
