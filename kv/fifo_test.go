//go:build unix

package kv_test

import (
	"errors"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/polyloop/polyloop/kv"
)

// TestANamedPipeIsNotAStore: opening a FIFO would block (read-only) or
// write into it; it is ErrNotAStore at once.
func TestANamedPipeIsNotAStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pipe.db")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Skip(err)
	}
	for _, ro := range []bool{true, false} {
		done := make(chan error, 1)
		go func() {
			_, err := kv.Open(path, kv.Options{ReadOnly: ro})
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, kv.ErrNotAStore) {
				t.Fatalf("read-only %t: got %v, want ErrNotAStore", ro, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("read-only %t: Open of a named pipe blocked", ro)
		}
	}
}
