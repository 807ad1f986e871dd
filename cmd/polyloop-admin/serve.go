package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/stores"
	"github.com/polyloop/polyloop/viewer"
)

// interruptCtx ends serve: Ctrl-C (tests replace it).
var interruptCtx = func() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt)
}

// hostList is the names --hosts gives (comma-separated), blanks left out.
func hostList(hosts string) []string {
	var out []string
	for h := range strings.SplitSeq(hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			out = append(out, h)
		}
	}
	return out
}

// serve serves the run viewer over s (named store in messages) on addr
// until interrupted, mounted as a writer of decisions by by (record: the
// engine's Decide or Resolve, by verdict), answering only to hosts — or,
// when there are none, to localhost and loopback addresses (viewer.Options.Hosts).
func serve(s stores.Store, store, addr, by string, hosts []string, stdout, stderr io.Writer) int {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(stderr, "polyloop-admin serve: listen on %s: %v\n", addr, err)
		return exitProblem
	}
	ctx, stop := interruptCtx()
	defer stop()
	o := viewer.Options{
		Decide: func(ctx context.Context, d events.Decision) (events.Envelope, error) {
			return record(ctx, s, d)
		},
		Reviewer: by,
		Hosts:    hosts,
	}
	srv := &http.Server{Handler: viewer.New(s, o), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(shut)
	}()
	answers := "localhost and loopback addresses"
	if len(hosts) > 0 {
		answers = strings.Join(hosts, ", ")
	}
	fmt.Fprintf(stdout, "serving %s at http://%s/ (decisions recorded as %s; answering to %s; Ctrl-C stops)\n", store, l.Addr(), by, answers)
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(stderr, "polyloop-admin serve: %v\n", err)
		return exitProblem
	}
	return exitOK
}
