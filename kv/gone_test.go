package kv

import (
	"net"
	"path/filepath"
	"testing"
)

// TestAReaderOfAWriterKilledBetweenReadsReadsTheFile: a writer gone
// between two reads (its socket left behind, refusing connections, as a
// killed writer leaves it) costs the next read nothing: the request never
// reached a writer, so the Reader reads the file at once.
func TestAReaderOfAWriterKilledBetweenReadsReadsTheFile(t *testing.T) {
	path := filepath.Join(shortDir(t), "s.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := OpenReader(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Remote() == nil {
		t.Fatal("the Reader does not read through the writer's socket")
	}
	s.Close()
	l, err := net.Listen("unix", SocketPath(path)) // the socket a killed writer leaves
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if _, err := r.Runs(t.Context()); err != nil {
		t.Fatalf("a read after the writer was killed: %v", err)
	}
	if r.Remote() != nil {
		t.Error("the Reader still reads through a socket")
	}
}
