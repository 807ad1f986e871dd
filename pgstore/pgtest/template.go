package pgtest

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// The template cluster. initdb makes the same cluster for every server of
// one PostgreSQL installation, and takes a second of CPU or more (each test
// binary that needs PostgreSQL starts a server; make ci starts a dozen): so
// the first server makes one cluster, the template, in the temporary
// directory, and every server after it starts on a copy of it (a copy of
// its 39 MB, checked, took 0.27-0.5 CPU-s here, initdb 1.4).
//
//   - What a copy gets is what initdb made: the template's manifest (its
//     superuser's password, and every directory and file with its mode,
//     size and CRC-32C) is written when it is made, and a copy takes the
//     files the manifest lists and checks each against it. A template
//     damaged since (a killed process, a crash of a disk that was never
//     synced, a cleaner of old files) is made again.
//   - It is private to the user: the directory, the manifest and the
//     cluster in it are theirs alone (as root, initdb runs as the server's
//     user, and the cluster is then given to root; each copy is made as
//     root's in a directory only root writes and given to the server's
//     user once whole, so nothing the server's user plants is followed),
//     so no other user and no server can change what the next server
//     starts on. A template that is not so is not used.
//   - Servers of concurrent test binaries take it in turn: a copy holds a
//     shared lock on a file beside it, and making or removing the template
//     an exclusive one, so no copy reads a template being replaced, and two
//     binaries finding none make it once. It is made in a directory of its
//     own and renamed into place, so a process killed while making it
//     leaves no half template (and the next maker removes what it left).
//   - It is named for the installation (the postgres binary's path, size
//     and time, so an upgrade makes a new one), for the user and for
//     templateFormat, and left in the temporary directory for the next run,
//     as a build cache is: remove $TMPDIR/polyloop-pgtest-* to reclaim it.
//
// A template that cannot be had (another user's directory of the name, a
// copy failing on its own side, for want of room say) is bypassed: the
// server makes its own cluster with initdb, as before, and the line lookup
// prints says why. The template is not what a user of the server's uid
// could change, save by racing initdb while it makes the template (a
// process killed meanwhile may leave initdb running in the maker's
// directory, which the next maker removes as best it can).

// templateFormat changes when the cluster a template holds would change
// (initdb's arguments) or the manifest's form, so an older one is not used.
const templateFormat = 1

// templateRoot is the directory templates are made in (a test of them
// makes its own).
var templateRoot = os.TempDir

// template is a template cluster as its manifest describes it.
type template struct {
	dir      string
	password string // the superuser's
	entries  []templateEntry
}

// templateEntry is a directory or a file of the cluster.
type templateEntry struct {
	path string // relative to the cluster
	dir  bool
	mode fs.FileMode
	size int64
	crc  uint32
}

// fromTemplate puts a copy of the template cluster at data for s, making
// the template first when there is none or it was damaged, and says how
// the cluster was made.
func (s *Server) fromTemplate(data string) (made string, err error) {
	dir, err := s.templateDir()
	if err != nil {
		return "", err
	}
	lock, err := lockFile(dir+".lock", syscall.LOCK_SH)
	if err != nil {
		return "", err
	}
	defer func() { lock.Close() }() // and the lock with it
	if err := s.copyTemplate(dir, data); err == nil {
		return "from a copy of the template cluster", nil
	} else if errors.As(err, new(copyError)) {
		return "", err
	}
	// Missing or damaged: looked at again under the exclusive lock, which
	// waits for every copy in progress (another binary may have made it
	// meanwhile), then made again.
	lock.Close()
	if lock, err = lockFile(dir+".lock", syscall.LOCK_EX); err != nil {
		return "", err
	}
	os.RemoveAll(data)
	why := s.copyTemplate(dir, data)
	if why == nil {
		return "from a copy of the template cluster", nil
	} else if errors.As(why, new(copyError)) {
		return "", why
	}
	os.RemoveAll(data)
	_, statErr := os.Lstat(dir)
	missing := errors.Is(statErr, fs.ErrNotExist)
	if !missing {
		if err := removeOwn(dir); err != nil {
			return "", fmt.Errorf("%v; removing it: %w", why, err)
		}
	}
	leftovers, _ := filepath.Glob(dir + ".making-*")
	for _, d := range leftovers { // of a maker killed, which held the lock
		removeOwn(d)
	}
	if err := s.makeTemplate(dir); err != nil {
		return "", err
	}
	if err := s.copyTemplate(dir, data); err != nil {
		return "", err
	}
	if missing {
		return "from a copy of the template cluster, made for it", nil
	}
	return fmt.Sprintf("from a copy of the template cluster, made again (%v)", why), nil
}

// templateDir is where s's installation's template is.
func (s *Server) templateDir() (string, error) {
	fi, err := os.Stat(filepath.Join(s.bin, "postgres"))
	if err != nil {
		return "", err
	}
	// initdb writes the maker's TZ into the cluster's configuration.
	key := sha256.Sum256(fmt.Appendf(nil, "%d\x00%s\x00%d\x00%d\x00%s", templateFormat, s.bin, fi.Size(), fi.ModTime().UnixNano(), os.Getenv("TZ")))
	return filepath.Join(templateRoot(), fmt.Sprintf("polyloop-pgtest-%d-%s", os.Geteuid(), hex.EncodeToString(key[:8]))), nil
}

// openLock opens (creating) the lock file of a template, refusing one
// another user made.
func openLock(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	if err := ownedPrivately(f.Stat()); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// lockFile takes the lock how on the lock file at path, opening it again
// if it was replaced meanwhile (a cleaner of old files removed it): a lock
// on a file no longer at path excludes no one.
func lockFile(path string, how int) (*os.File, error) {
	for {
		f, err := openLock(path)
		if err != nil {
			return nil, err
		}
		if err := flock(f, how); err != nil {
			f.Close()
			return nil, err
		}
		held, err1 := f.Stat()
		now, err2 := os.Lstat(path)
		if err1 == nil && err2 == nil && os.SameFile(held, now) {
			return f, nil
		}
		f.Close()
	}
}

func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if err != syscall.EINTR {
			return err
		}
	}
}

// ownedPrivately refuses what is not this user's, or what others may write.
func ownedPrivately(fi fs.FileInfo, err error) error {
	if err != nil {
		return err
	}
	if ownerOf(fi) != os.Geteuid() || fi.Mode().Perm()&0o077 != 0 || fi.Mode()&fs.ModeSymlink != 0 {
		return fmt.Errorf("not private to this user (%d): owner %d, mode %v", os.Geteuid(), ownerOf(fi), fi.Mode())
	}
	return nil
}

// ownerOf is fi's owner's uid, -1 where the system does not say.
func ownerOf(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}

// removeOwn removes path unless it is another user's.
func removeOwn(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil
	}
	if owner := ownerOf(fi); owner != os.Geteuid() {
		return fmt.Errorf("%s is user %d's", path, owner)
	}
	return os.RemoveAll(path)
}

// copyTemplate copies the template in dir to data, as its manifest lists
// it, checking each file against it, and takes its password. The copy is
// given to the server's user once whole, each entry before the directory
// holding it (until then it is root's, in s.dir, which is root's). An
// error of the copy's own side (no room, say) is a copyError: the
// template is not to blame.
func (s *Server) copyTemplate(dir, data string) error {
	if err := ownedPrivately(os.Lstat(dir)); err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	}
	t, err := readManifest(dir)
	if err != nil {
		return err
	}
	src := filepath.Join(dir, "data")
	for _, e := range t.entries {
		if err := copyEntry(filepath.Join(src, e.path), filepath.Join(data, e.path), e); err != nil {
			return fmt.Errorf("template %s: %w", dir, err)
		}
	}
	if s.cred != nil {
		for i := len(t.entries) - 1; i >= 0; i-- {
			if err := os.Lchown(filepath.Join(data, t.entries[i].path), int(s.cred.Uid), int(s.cred.Gid)); err != nil {
				return copyError{err}
			}
		}
	}
	s.Password, s.template = t.password, t
	return nil
}

// copyError is an error of a copy's own side.
type copyError struct{ err error }

func (e copyError) Error() string { return "the copy: " + e.err.Error() }
func (e copyError) Unwrap() error { return e.err }

// copyEntry makes dst as the manifest's entry e says, a directory or a
// copy of the regular file src, refusing a src that is not what e says.
func copyEntry(src, dst string, e templateEntry) error {
	if e.dir {
		if err := os.Mkdir(dst, 0o700); err != nil {
			return copyError{err}
		}
		if err := os.Chmod(dst, e.mode); err != nil {
			return copyError{err}
		}
		return nil
	}
	// O_NONBLOCK: a FIFO put in its place is refused, not waited on.
	in, err := os.OpenFile(src, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	if fi, err := in.Stat(); err != nil || !fi.Mode().IsRegular() || fi.Size() != e.size {
		return fmt.Errorf("%s is not the %d-byte file the manifest lists", e.path, e.size)
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return copyError{err}
	}
	h := crc32.New(castagnoli)
	n, err := io.Copy(out, io.TeeReader(in, h))
	if err := errors.Join(out.Chmod(e.mode), out.Close()); err != nil {
		return copyError{err}
	}
	if err != nil {
		var we *fs.PathError
		if errors.As(err, &we) && we.Path == dst {
			return copyError{err}
		}
		return err
	}
	if n != e.size || h.Sum32() != e.crc {
		return fmt.Errorf("%s changed since the template was made (%d bytes, crc %08x; the manifest: %d, %08x)", e.path, n, h.Sum32(), e.size, e.crc)
	}
	return nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// makeTemplate makes the template at dir: initdb in a directory of its
// own beside it, the cluster then this user's, its manifest written, and
// the directory renamed to dir. The caller holds the exclusive lock.
func (s *Server) makeTemplate(dir string) error {
	tmp, err := os.MkdirTemp(filepath.Dir(dir), filepath.Base(dir)+".making-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp) // nothing left once renamed
	data := filepath.Join(tmp, "data")
	if s.cred != nil {
		// initdb runs as the server's user: it passes through tmp to the
		// data directory Server.initdb makes for it.
		if err := os.Chmod(tmp, 0o711); err != nil {
			return err
		}
	}
	password, err := s.initdb(data)
	if err != nil {
		return err
	}
	var manifest strings.Builder
	fmt.Fprintf(&manifest, "polyloop-pgtest template %d\npassword %s\n", templateFormat, password)
	n := 0
	err = filepath.WalkDir(data, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := os.Lchown(path, os.Geteuid(), os.Getegid()); err != nil {
			return err
		}
		rel, err := filepath.Rel(data, path)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			fmt.Fprintf(&manifest, "d %o %q\n", fi.Mode().Perm(), rel)
		case d.Type().IsRegular():
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			fmt.Fprintf(&manifest, "f %o %d %08x %q\n", fi.Mode().Perm(), len(b), crc32.Checksum(b, castagnoli), rel)
		default:
			return fmt.Errorf("initdb made %s, neither a directory nor a regular file (%v)", rel, d.Type())
		}
		n++
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(&manifest, "end %d\n", n)
	if err := os.WriteFile(filepath.Join(tmp, "manifest"), []byte(manifest.String()), 0o600); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o700); err != nil {
		return err
	}
	return os.Rename(tmp, dir)
}

// readManifest reads the manifest of the template in dir, refusing one
// that is not whole.
func readManifest(dir string) (template, error) {
	f, err := os.OpenFile(filepath.Join(dir, "manifest"), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return template{}, err
	}
	defer f.Close()
	if err := ownedPrivately(f.Stat()); err != nil {
		return template{}, fmt.Errorf("%s/manifest: %w", dir, err)
	}
	t := template{dir: dir}
	bad := func(line string) (template, error) {
		return template{}, fmt.Errorf("%s/manifest is damaged or of another format: %.80q", dir, line)
	}
	sc := bufio.NewScanner(f)
	header := []string{fmt.Sprintf("polyloop-pgtest template %d", templateFormat)}
	for i := 0; sc.Scan(); i++ {
		line := sc.Text()
		switch {
		case i == 0:
			if line != header[0] {
				return bad(line)
			}
		case i == 1:
			pw, ok := strings.CutPrefix(line, "password ")
			if !ok || pw == "" {
				return bad(line)
			}
			t.password = pw
		case strings.HasPrefix(line, "end "):
			if n, err := strconv.Atoi(line[len("end "):]); err != nil || n != len(t.entries) || n == 0 || sc.Scan() {
				return bad(line)
			}
			return t, nil
		default:
			e, ok := parseEntry(line)
			if !ok {
				return bad(line)
			}
			t.entries = append(t.entries, e)
		}
	}
	if err := sc.Err(); err != nil {
		return template{}, err
	}
	return bad("(no end)")
}

// parseEntry parses a manifest line: "d MODE PATH" or "f MODE SIZE CRC
// PATH", the path quoted and inside the cluster.
func parseEntry(line string) (templateEntry, bool) {
	fields := strings.SplitN(line, " ", 3)
	if len(fields) != 3 || (fields[0] != "d" && fields[0] != "f") {
		return templateEntry{}, false
	}
	mode, err := strconv.ParseUint(fields[1], 8, 32)
	if err != nil || mode&^0o777 != 0 {
		return templateEntry{}, false
	}
	e := templateEntry{dir: fields[0] == "d", mode: fs.FileMode(mode)}
	rest := fields[2]
	if !e.dir {
		parts := strings.SplitN(rest, " ", 3)
		if len(parts) != 3 {
			return templateEntry{}, false
		}
		size, err1 := strconv.ParseInt(parts[0], 10, 64)
		crc, err2 := strconv.ParseUint(parts[1], 16, 32)
		if err1 != nil || err2 != nil || size < 0 {
			return templateEntry{}, false
		}
		e.size, e.crc, rest = size, uint32(crc), parts[2]
	}
	path, err := strconv.Unquote(rest)
	if err != nil || !filepath.IsLocal(path) && path != "." {
		return templateEntry{}, false
	}
	e.path = path
	return e, true
}
