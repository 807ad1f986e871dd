package kv

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"
)

// TestKeptAliveConnectionsLockNoReaderOut: more connections than the
// writer serves requests at once, each kept alive after a request (as a
// follower polling keeps its own), leave room for one more reader.
func TestKeptAliveConnectionsLockNoReaderOut(t *testing.T) {
	path := filepath.Join(shortDir(t), "s.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	stop := make(chan struct{})
	defer close(stop)
	for i := range maxServedRequests + 4 {
		c, err := net.Dial("unix", SocketPath(path))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second)) // a connection the writer does not take fails, not hangs
		br := bufio.NewReader(c)
		hello := func() error {
			fmt.Fprintf(c, "GET /hello HTTP/1.1\r\nHost: polyloop-kv\r\n%s: %s\r\n\r\n", protocolHeader, ProtocolVersion)
			resp, err := http.ReadResponse(br, nil)
			if err == nil {
				resp.Body.Close()
			}
			return err
		}
		if err := hello(); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		go func() { // a follower polling on its connection: never idle long
			for {
				select {
				case <-stop:
					return
				case <-time.After(250 * time.Millisecond):
					if hello() != nil {
						return
					}
				}
			}
		}()
	}
	r, err := Dial(path)
	if err != nil {
		t.Fatalf("a reader after %d kept-alive connections: %v", maxServedRequests+4, err)
	}
	defer r.Close()
	if _, err := r.Runs(t.Context()); err != nil {
		t.Fatalf("a reader after %d kept-alive connections: Runs: %v", maxServedRequests+4, err)
	}
}
