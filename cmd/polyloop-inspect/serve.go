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
	"time"

	"github.com/polyloop/polyloop/viewer"
)

func serveFlags(fs *flag.FlagSet, c *call) {
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8080", "address to listen on (loopback unless you say otherwise)")
}

// interruptCtx ends serve and events --follow: Ctrl-C (tests replace it).
var interruptCtx = func() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt)
}

// serveCommand serves the read-only run viewer over the store until
// interrupted.
func serveCommand(c *call) int {
	s, ok := c.openStore(c.args[0])
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
	srv := &http.Server{Handler: viewer.New(s, viewer.Options{}), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(shut)
	}()
	fmt.Fprintf(c.stdout, "serving %s at http://%s/ (read-only; Ctrl-C stops)\n", c.store(), l.Addr())
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return c.fail("serve: %v", err)
	}
	return exitOK
}
