package kv

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAReaderTrustsOnlyItsOwnUsersWriter: a reader refuses a socket that
// answers as a process of another user (the answering process's user, by
// the kernel on Linux, and the socket file's owner), a symbolic link in
// the socket's place and anything that is not a socket, each with an
// error naming the socket and what is wrong; a writer finding another
// user's socket at its path leaves it and says so in Serving.
func TestAReaderTrustsOnlyItsOwnUsersWriter(t *testing.T) {
	me := os.Getuid()
	if err := answeredBy("/x/s.db.sock", me); err != nil {
		t.Errorf("a writer of this user: %v", err)
	}
	err := answeredBy("/x/s.db.sock", me+1)
	if err == nil || !strings.Contains(err.Error(), "/x/s.db.sock") || !strings.Contains(err.Error(), fmt.Sprint("user ", me+1)) {
		t.Errorf("a writer of another user: %v, want a refusal naming the socket and its user", err)
	}

	dir := shortDir(t)
	path := filepath.Join(dir, "a.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if r, err := Dial(path); err != nil {
		t.Fatalf("Dial of this user's writer: %v", err)
	} else {
		r.Close()
	}

	// A symbolic link planted where b.db's socket belongs, to a.db's.
	link := filepath.Join(dir, "b.db")
	if err := os.Symlink(SocketPath(path), SocketPath(link)); err != nil {
		t.Fatal(err)
	}
	if _, err := Dial(link); err == nil || errors.Is(err, errNoSocket) || !strings.Contains(err.Error(), "symbolic link") || !strings.Contains(err.Error(), SocketPath(link)) {
		t.Errorf("Dial through a symbolic link: %v, want a refusal naming the link", err)
	}
	// A plain file where c.db's socket belongs.
	plain := filepath.Join(dir, "c.db")
	if err := os.WriteFile(SocketPath(plain), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Dial(plain); err == nil || errors.Is(err, errNoSocket) || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("Dial of a plain file: %v, want a refusal saying it is not a socket", err)
	}

	if me != 0 {
		t.Skip("the rest gives a socket to another user, which only root may")
	}
	const other = 54321
	// Another user's process answering at d.db's socket, as it would in a
	// shared sticky directory.
	fake := filepath.Join(dir, "d.db")
	l, err := net.Listen("unix", SocketPath(fake))
	if err != nil {
		t.Fatal(err)
	}
	go http.Serve(l, newHandler(s)) // it answers as a writer would
	defer l.Close()
	if err := os.Lchown(SocketPath(fake), other, other); err != nil {
		t.Fatal(err)
	}
	if _, err := Dial(fake); err == nil || errors.Is(err, errNoSocket) || !strings.Contains(err.Error(), fmt.Sprint("user ", other)) || !strings.Contains(err.Error(), SocketPath(fake)) {
		t.Errorf("Dial of another user's socket: %v, want a refusal naming it and its owner", err)
	}
	// The writer of d.db leaves that socket, and says why it serves none.
	w, err := Open(fake, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Serving(); !errors.Is(err, ErrNotServed) || !strings.Contains(err.Error(), fmt.Sprint("user ", other)) {
		t.Errorf("a writer finding another user's socket: Serving: %v, want ErrNotServed naming its owner", err)
	}
	if fi, err := os.Lstat(SocketPath(fake)); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Errorf("another user's socket was not left as it was: %v, %v", fi, err)
	}
}
