package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/viewer"
)

func serveFlags(fs *flag.FlagSet, c *call) {
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8080", "address to listen on (loopback unless you say otherwise)")
	fs.BoolVar(&c.allowDecisions, "allow-decisions", false, "offer approve, reject and resolve on the pages, and record them (opens the store for writing)")
	fs.StringVar(&c.by, "by", "", "with --allow-decisions: who the decisions are recorded as")
	fs.StringVar(&c.hosts, "hosts", "", "with --allow-decisions: the host names (host or host:port, comma-separated) the pages are reached by (default: localhost and loopback addresses; any other is refused, as a rebound DNS name would be)")
}

// interruptCtx ends serve and events --follow: Ctrl-C (tests replace it).
var interruptCtx = func() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt)
}

// serveCommand serves the run viewer over the store until interrupted;
// with --allow-decisions, one that records decisions by --by.
func serveCommand(c *call) int {
	switch {
	case c.allowDecisions && c.by == "":
		fmt.Fprintf(c.stderr, "polyloop-inspect serve: --allow-decisions needs --by NAME: who the decisions are recorded as\n(polyloop-inspect serve --help)\n")
		return exitUsage
	case !c.allowDecisions && c.by != "":
		fmt.Fprintf(c.stderr, "polyloop-inspect serve: --by names who decides: it needs --allow-decisions\n(polyloop-inspect serve --help)\n")
		return exitUsage
	case !c.allowDecisions && c.hosts != "":
		fmt.Fprintf(c.stderr, "polyloop-inspect serve: --hosts names where the decision pages are reached: it needs --allow-decisions\n(polyloop-inspect serve --help)\n")
		return exitUsage
	}
	s, ok := c.openStore(c.args[0]) // for writing with --allow-decisions
	if !ok {
		return exitProblem
	}
	defer s.Close()
	l, err := net.Listen("tcp", c.addr)
	if err != nil {
		return c.fail("listen on %s: %v", c.addr, err)
	}
	ctx, stop := interruptCtx()
	defer stop()
	o, mode := viewer.Options{}, "read-only"
	if c.allowDecisions {
		o, mode = decisions(s, c.by), "decisions recorded as "+escape(c.by)
		for h := range strings.SplitSeq(c.hosts, ",") {
			if h = strings.TrimSpace(h); h != "" {
				o.Hosts = append(o.Hosts, h)
			}
		}
	}
	srv := &http.Server{Handler: viewer.New(s, o), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(shut)
	}()
	fmt.Fprintf(c.stdout, "serving %s at http://%s/ (%s; Ctrl-C stops)\n", c.store(), l.Addr(), mode)
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return c.fail("serve: %v", err)
	}
	return exitOK
}

// decisions mount the viewer as a writer of decisions over store, by by:
// engine.Decide answers an approval, engine.Resolve a finding on an action
// in doubt (their refusals answered by viewer.DecisionStatus).
func decisions(store seams.RunStore, by string) viewer.Options {
	return viewer.Options{
		Decide: func(ctx context.Context, d events.Decision) (events.Envelope, error) {
			if d.Verdict.Resolves() {
				return engine.Resolve(ctx, store, d)
			}
			return engine.Decide(ctx, store, d)
		},
		Reviewer: by,
	}
}
