package pgtest

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// The template cluster. initdb makes the same cluster for every server of
// one PostgreSQL installation, and takes a second of CPU or more (each test
// binary that needs PostgreSQL starts a server; make ci starts a dozen): so
// the first server makes one cluster, the template, in the temporary
// directory, and every server after it starts on a copy of it (a copy of
// its 40 MB takes a tenth of what initdb does). The template is private to
// the user (a directory only they can write, its password file only they
// can read), is named for the installation (the postgres binary's path,
// size and time, so an upgrade makes a new one) and for templateFormat,
// and is made whole before it is renamed into place, so a server never
// copies half of one. It is left in the temporary directory for the next
// run, as a build cache is: remove $TMPDIR/polyloop-pgtest-* to reclaim
// it. A template that cannot be used is made again or bypassed (initdb as
// before); the line lookup prints says which.

// templateFormat changes when the cluster a template holds would change
// (initdb's arguments), so an older one is not used.
const templateFormat = 1

// templateRoot is the directory templates are made in (a test of them
// makes its own).
var templateRoot = os.TempDir

// template is a made template cluster: its directory, holding data (the
// cluster) and password (its superuser's).
type template struct {
	dir      string
	password string
}

// fromTemplate copies the template cluster into data, making the template
// first when there is none, and returns its superuser's password.
func (s *Server) fromTemplate(data string) (password string, err error) {
	t, err := s.findTemplate()
	if err != nil {
		return "", err
	}
	if err := copyTree(filepath.Join(t.dir, "data"), data, s.cred); err != nil {
		return "", fmt.Errorf("copy %s: %w", t.dir, err)
	}
	s.template = t
	return t.password, nil
}

// findTemplate is the template for s's installation, made if missing.
func (s *Server) findTemplate() (template, error) {
	fi, err := os.Stat(filepath.Join(s.bin, "postgres"))
	if err != nil {
		return template{}, err
	}
	key := sha256.Sum256(fmt.Appendf(nil, "%d\x00%s\x00%d\x00%d", templateFormat, s.bin, fi.Size(), fi.ModTime().UnixNano()))
	dir := filepath.Join(templateRoot(), fmt.Sprintf("polyloop-pgtest-%d-%s", os.Geteuid(), hex.EncodeToString(key[:8])))
	if t, err := readTemplate(dir); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return t, err
	}
	if err := s.makeTemplate(dir); err != nil {
		return template{}, err
	}
	return readTemplate(dir)
}

// readTemplate reads the template in dir, refusing one another user could
// have written.
func readTemplate(dir string) (template, error) {
	fi, err := os.Lstat(dir)
	if err != nil {
		return template{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&0o022 != 0 {
		return template{}, fmt.Errorf("%s is not a directory only this user (%d) can write", dir, os.Geteuid())
	}
	pw, err := os.ReadFile(filepath.Join(dir, "password"))
	if err != nil {
		return template{}, err
	}
	return template{dir: dir, password: string(pw)}, nil
}

// makeTemplate makes the template in a directory of its own beside dir
// and renames it to dir: another process making it at the same time
// renames its own first or after, and either way dir holds a whole one.
func (s *Server) makeTemplate(dir string) error {
	tmp, err := os.MkdirTemp(filepath.Dir(dir), filepath.Base(dir)+".making-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp) // nothing left once renamed
	data := filepath.Join(tmp, "data")
	if s.cred != nil {
		// The server's user makes the cluster: it needs to pass through
		// tmp (owned by this user) to a data directory of its own.
		if err := os.Chmod(tmp, 0o711); err != nil {
			return err
		}
		if err := os.Mkdir(data, 0o700); err != nil {
			return err
		}
		if err := os.Chown(data, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return err
		}
	}
	password, err := s.initdb(data)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, "password"), []byte(password), 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, statErr := os.Stat(filepath.Join(dir, "password")); statErr == nil {
			return nil // another process made it first
		}
		return err
	}
	return nil
}

// copyTree copies the directory src to dst (which must not exist):
// directories and regular files with their permissions, owned by cred's
// user when cred is not nil. A cluster holds nothing else.
func copyTree(src, dst string, cred *syscall.Credential) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			err = os.Mkdir(target, fi.Mode().Perm())
		case d.Type().IsRegular():
			err = copyFile(path, target, fi.Mode().Perm())
		default:
			return fmt.Errorf("%s is neither a directory nor a regular file (%v)", path, d.Type())
		}
		if err == nil && cred != nil {
			err = os.Lchown(target, int(cred.Uid), int(cred.Gid))
		}
		return err
	})
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
}
