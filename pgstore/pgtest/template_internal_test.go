package pgtest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestServersStartOnCopiesOfOneTemplate: initdb runs once per installation:
// the first server makes the template and starts on a copy of it, the next
// starts on another copy, with the template's password; a template whose
// cluster was damaged since is made again, the server that found it
// starting on a cluster of its own; a template another user could write is
// not used.
func TestServersStartOnCopiesOfOneTemplate(t *testing.T) {
	if os.Getenv(DSNEnv) != "" {
		t.Skip("needs throwaway servers; " + DSNEnv + " names a server of yours")
	}
	if _, err := findBin(); err != nil {
		Unavailable(t, err)
	}
	root := t.TempDir()
	for _, d := range []string{filepath.Dir(root), root} { // for the server's user, when it is another
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	templateRoot = func() string { return root }
	t.Cleanup(func() { templateRoot = os.TempDir })
	start := func(wantMade string) *Server {
		t.Helper()
		s, err := Start(Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Stop() })
		if !strings.HasPrefix(s.made, wantMade) {
			t.Errorf("the cluster was made %s, want %s", s.made, wantMade)
		}
		conn, err := pgx.Connect(context.Background(), s.DSN)
		if err != nil {
			t.Fatalf("connecting with the server's password: %v", err)
		}
		conn.Close(context.Background())
		return s
	}
	first := start("from a copy of the template cluster")
	second := start("from a copy of the template cluster")
	if first.template.dir == "" || second.template != first.template || second.Password != first.Password {
		t.Fatalf("two servers, templates %+v and %+v", first.template, second.template)
	}
	if fi, err := os.Stat(filepath.Join(first.template.dir, "password")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the template's password file: %v %v, want mode 0600", fi, err)
	}

	// Damaged: the copy does not start; the template goes, this server
	// makes its own, and the next makes the template again.
	if err := os.Remove(filepath.Join(first.template.dir, "data", "global", "pg_control")); err != nil {
		t.Fatal(err)
	}
	start("by initdb (the template cluster's copy did not start")
	if _, err := os.Stat(first.template.dir); !os.IsNotExist(err) {
		t.Fatalf("the damaged template is still there: %v", err)
	}
	remade := start("from a copy of the template cluster")
	if remade.template.dir != first.template.dir || remade.Password == first.Password {
		t.Errorf("the template made again: %+v (before: %+v)", remade.template, first.template)
	}

	// Writable by others: not used.
	if err := os.Chmod(remade.template.dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := readTemplate(remade.template.dir); err == nil || !strings.Contains(err.Error(), "only this user") {
		t.Errorf("a template others can write was read: %v", err)
	}
}
