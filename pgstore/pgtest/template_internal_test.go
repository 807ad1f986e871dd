package pgtest

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestServersStartOnCopiesOfOneTemplate: initdb runs once per installation.
// Binaries finding no template at once make it once; servers start on
// copies of it with its password; a template damaged since it was made (a
// byte changed, a file gone) is made again as it is copied, and a maker's
// leftovers removed, but a copy failing on its own side leaves it be; a
// template others could have written is not used as it is, another
// user's not at all; the template is the user's alone.
func TestServersStartOnCopiesOfOneTemplate(t *testing.T) {
	if os.Getenv(DSNEnv) != "" {
		t.Skip("needs throwaway servers; " + DSNEnv + " names a server of yours")
	}
	bin, err := findBin()
	if err != nil {
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

	// shell is a server not started, for copies without one.
	shell := func() *Server {
		s := &Server{bin: bin, dir: t.TempDir()}
		if os.Geteuid() == 0 {
			if s.cred, err = unprivileged(); err != nil {
				t.Fatal(err)
			}
			os.Chmod(s.dir, 0o711)
			os.Chown(s.dir, int(s.cred.Uid), int(s.cred.Gid))
		}
		return s
	}
	copyOf := func(s *Server) (made string, err error) {
		return s.fromTemplate(filepath.Join(s.dir, "data"))
	}

	// Three binaries at once, no template: one makes it, all copy it.
	var wg sync.WaitGroup
	shells, made, errs := []*Server{shell(), shell(), shell()}, make([]string, 3), make([]error, 3)
	for i, s := range shells {
		wg.Go(func() { made[i], errs[i] = copyOf(s) })
	}
	wg.Wait()
	makers := 0
	for i, s := range shells {
		if errs[i] != nil {
			t.Fatalf("copy %d: %v", i, errs[i])
		}
		if made[i] == "from a copy of the template cluster, made for it" {
			makers++
		}
		if s.Password != shells[0].Password || s.Password == "" {
			t.Errorf("copy %d has password %q, copy 0 %q", i, s.Password, shells[0].Password)
		}
	}
	if makers != 1 {
		t.Fatalf("%d of the three made the template (%q)", makers, made)
	}
	dir := shells[0].template.dir

	// A server on a copy, with the template's password.
	first, err := Start(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Stop()
	if first.made != "from a copy of the template cluster" || first.Password != shells[0].Password {
		t.Errorf("the next server's cluster was made %s (password %q, the template's %q)", first.made, first.Password, shells[0].Password)
	}
	conn, err := pgx.Connect(context.Background(), first.DSN)
	if err != nil {
		t.Fatalf("connecting with the template's password: %v", err)
	}
	conn.Close(context.Background())
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if fi, err := os.Lstat(path); err != nil || ownerOf(fi) != os.Geteuid() {
			t.Errorf("%s in the template is not this user's: %v", path, err)
		}
		return nil
	})

	// A copy failing on its own side (here: nowhere to put it) leaves the
	// template as it was.
	if made, err := shell().fromTemplate(filepath.Join(t.TempDir(), "no such directory", "data")); err == nil || !errors.As(err, new(copyError)) {
		t.Errorf("a copy with nowhere to go: made %s, %v, want the copy's error", made, err)
	}
	if kept, err := readManifest(dir); err != nil || kept.password != first.Password {
		t.Errorf("after a copy failed on its own side, the template's password is %q (%v), was %q", kept.password, err, first.Password)
	}

	// A byte changed, a file after it gone (a server would start without
	// it and refuse connections), a maker's leftovers: made again, the
	// first damage named (the byte: it is the CRC that finds it).
	catalog := filepath.Join(dir, "data", "base", "5", "1259")
	b, err := os.ReadFile(catalog)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	if err := os.WriteFile(catalog, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "data", "global", "pg_control")); err != nil {
		t.Fatal(err)
	}
	leftover := dir + ".making-killed"
	if err := os.MkdirAll(filepath.Join(leftover, "data"), 0o700); err != nil {
		t.Fatal(err)
	}
	s := shell()
	if made, err := copyOf(s); err != nil || !strings.HasPrefix(made, "from a copy of the template cluster, made again") ||
		!strings.Contains(made, filepath.Join("base", "5", "1259")+" changed since the template was made") || s.Password == first.Password {
		t.Errorf("after the template was damaged: made %s, %v, password %q (before: %q)", made, err, s.Password, first.Password)
	}
	if _, err := os.Stat(leftover); !os.IsNotExist(err) {
		t.Errorf("a killed maker's directory is left: %v", err)
	}

	// Others could have written it: not used as it is.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := shell().copyTemplate(dir, filepath.Join(t.TempDir(), "data")); err == nil || !strings.Contains(err.Error(), "not private to this user") {
		t.Errorf("a template others can write: %v", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}

	// Another user's: not used, not removed.
	if s.cred != nil {
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			t.Fatal(err)
		}
		if made, err := copyOf(shell()); err == nil || !strings.Contains(err.Error(), "is user") {
			t.Errorf("another user's template: made %s, %v", made, err)
		}
		if _, err := os.Stat(filepath.Join(dir, "manifest")); err != nil {
			t.Errorf("another user's template was removed: %v", err)
		}
		os.Chown(dir, 0, 0)
	}
}
