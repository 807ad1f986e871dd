package kv

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestCloseStopsTheServedReadsFirst: Close with a served read in progress
// cancels that read and waits for it before the file closes, and a Reader
// that reads meanwhile gets a clear error (the writer is closing), never a
// guess that the writer does not serve readers; once Close returned, the
// Reader reads the file.
func TestCloseStopsTheServedReadsFirst(t *testing.T) {
	ctx := context.Background()
	defer func(was int) { maxChunkBytes = was }(maxChunkBytes)
	maxChunkBytes = 1 << 10
	path := filepath.Join(shortDir(t), "s.db")
	s, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	run := bigRun(t, s, 8, 4<<10)

	started, cancelled, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var once sync.Once
	servedValueHook = func(ctx context.Context) {
		once.Do(func() {
			close(started)
			select {
			case <-ctx.Done():
				close(cancelled)
			case <-time.After(10 * time.Second):
				t.Error("the served read's context was not cancelled while Close waited for it")
			}
			<-release
		})
	}
	defer func() { servedValueHook = nil }()

	served, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer served.Close()
	readDone := make(chan error, 1)
	go func() { _, err := served.Load(ctx, run); readDone <- err }()
	<-started
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	<-cancelled

	// The served read holds its transaction (the hook): the file is still
	// held. A Reader now must say the writer is closing, not guess.
	_, rerr := OpenReader(path, Options{LockTimeout: 50 * time.Millisecond})
	t.Logf("a Reader during Close: %v", rerr)
	if rerr == nil || strings.Contains(rerr.Error(), "NoServe") || !strings.Contains(rerr.Error(), "closing") {
		t.Errorf("a Reader during Close: %v; want an error saying the writer is closing the store", rerr)
	}
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a served read was still in progress", err)
	default:
	}
	close(release)
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-readDone; err == nil || !errors.Is(err, ErrWriterGone) || err.Error() != path+`: load run "big": the process writing it stopped the read: it is closing the store; the file can be read directly once it has` {
		t.Errorf("the read Close stopped: %v; want ErrWriterGone saying the writer is closing the store", err)
	}
	r, err := OpenReader(path, Options{LockTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatalf("a Reader after Close: %v", err)
	}
	defer r.Close()
	if got, err := r.Load(ctx, run); err != nil || len(got) != 17 {
		t.Errorf("Load after Close: %d events, %v", len(got), err)
	}
}

// TestARelativeStorePathServesAnAbsoluteSocket: a store opened by a
// relative path listens on its socket's absolute path, and Close removes
// that socket even when the working directory changed meanwhile.
func TestARelativeStorePathServesAnAbsoluteSocket(t *testing.T) {
	dir := shortDir(t)
	t.Chdir(dir)
	s, err := Open("s.db", Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	sock, err := s.Serving()
	if err != nil || sock != filepath.Join(dir, "s.db.sock") {
		t.Errorf("Serving: %q, %v; want %q", sock, err, filepath.Join(dir, "s.db.sock"))
	}
	t.Chdir(t.TempDir())
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "s.db.sock")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the socket is left after Close: %v", err)
	}
}

// TestWhyAReaderOfAHeldFileIsRefused: a Reader of a file held by a writer
// that does not answer on its socket says why, naming the file once, with
// no package prefix inside, and no guess where the cause is known.
func TestWhyAReaderOfAHeldFileIsRefused(t *testing.T) {
	dir := shortDir(t)
	long := filepath.Join(dir, strings.Repeat("d", 100))
	if err := os.Mkdir(long, 0o700); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, "stale.db")
	for _, c := range []struct {
		name, path string
		before     func()
		want       string
	}{
		{"no socket", filepath.Join(dir, "off.db"), func() {},
			"; and it does not answer readers on its socket (a writer opened with kv.Options.NoServe, or of a version without the socket)"},
		{"a path too long", filepath.Join(long, "s.db"), func() {},
			fmt.Sprintf("; and it cannot answer readers: its socket's path is too long for a Unix socket (%d bytes, limit 107; move the store to a shorter path)", len(filepath.Join(long, "s.db.sock")))},
		{"a socket nobody listens on", stale, func() {
			l, err := net.Listen("unix", stale+".sock")
			if err != nil {
				t.Fatal(err)
			}
			l.(*net.UnixListener).SetUnlinkOnClose(false)
			l.Close()
		}, "; and it does not answer readers on its socket: connection refused"},
	} {
		w, err := Open(c.path, Options{NoServe: true})
		if err != nil {
			t.Fatal(err)
		}
		c.before()
		_, err = OpenReader(c.path, Options{LockTimeout: 20 * time.Millisecond})
		w.Close()
		want := fmt.Sprintf("kv: store file is locked by this process: %s is already open in it (close that kv.Store first)", c.path) + c.want
		if err == nil || err.Error() != want || !errors.Is(err, ErrLocked) {
			t.Errorf("%s:\n  got  %v\n  want %s", c.name, err, want)
		}
	}
}

// TestWhatARemoteSaysWhenItsWriterStops: a Remote whose writer stopped
// says so naming the file once, without a package prefix (a command
// prints it after its own name), and why: the socket gone (the writer
// closed the store), the socket refusing connections (killed).
func TestWhatARemoteSaysWhenItsWriterStops(t *testing.T) {
	ctx := context.Background()
	dir := shortDir(t)
	for _, c := range []struct {
		name  string
		after func(path string)
		want  string
	}{
		{"the socket is gone", func(string) {},
			": list runs: the process writing it stopped answering (its socket is gone: it closed the store); the file can be read directly now"},
		{"the socket refuses", func(path string) {
			l, err := net.Listen("unix", SocketPath(path))
			if err != nil {
				t.Fatal(err)
			}
			l.(*net.UnixListener).SetUnlinkOnClose(false)
			l.Close()
		}, ": list runs: the process writing it stopped answering (its socket refuses connections: it was killed); the file can be read directly now"},
	} {
		path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-")+".db")
		w, err := Open(path, Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		r, err := Dial(path)
		if err != nil {
			t.Fatal(err)
		}
		r.client.CloseIdleConnections()
		w.Close()
		c.after(path)
		_, err = r.Runs(ctx)
		r.Close()
		if want := path + c.want; err == nil || err.Error() != want || !errors.Is(err, ErrWriterGone) {
			t.Errorf("%s:\n  got  %v\n  want %s", c.name, err, want)
		}
	}
}
