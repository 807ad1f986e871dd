// Package pgtest gives tests a PostgreSQL server: a throwaway one it starts
// itself (a cluster in a temporary directory — a copy of the template
// cluster initdb made once for the installation, template.go — the server
// listening on a Unix socket in that directory and on no TCP port, stopped
// and removed at the end, and gone with the test process if that dies
// first), or the server named by the environment variable POLYLOOP_PG_DSN.
//
// It finds initdb and postgres on PATH or under /usr/lib/postgresql/*/bin.
// PostgreSQL refuses to run as root, so a test running as root (CI does)
// starts the server as the unprivileged user "postgres", which Debian's
// package creates (pgtest creates it when it is missing). Without a server
// the tests that need one skip, with a line saying how to run them — unless
// POLYLOOP_PG_REQUIRED is set, which turns the skip into a failure (CI sets
// it). An Example cannot skip: Main leaves the examples it is told need a
// server out of such a run, saying so.
//
// What does not live here: the store (package pgstore) and its tests.
package pgtest

import (
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/polyloop/polyloop/pgstore"
)

// Environment variables read by this package.
const (
	// DSNEnv names a server to use instead of a throwaway one.
	DSNEnv = "POLYLOOP_PG_DSN"
	// RequiredEnv, when set and not "0", makes a missing server a failure.
	RequiredEnv = "POLYLOOP_PG_REQUIRED"
)

// SkipHint is the line a skipped test prints.
const SkipHint = "no PostgreSQL server: install PostgreSQL (initdb on PATH or in /usr/lib/postgresql/*/bin) or set " +
	DSNEnv + " to run the PostgreSQL tests"

// Server is a throwaway PostgreSQL server.
type Server struct {
	dir  string // data directory and socket directory
	bin  string // directory holding initdb, pg_ctl, postgres
	cred *syscall.Credential
	opts []string // the server's command line

	proc     *os.Process
	exited   chan struct{} // closed when the server process has exited
	made     string        // how its cluster was made, for the line lookup prints
	template template      // the template its cluster was copied from, if it was

	// DSN connects to the server's "postgres" database over its socket,
	// as the superuser postgres with Password.
	DSN      string
	Password string
}

// Options configure Start.
type Options struct {
	// Durable keeps fsync on (benchmarks measure real commits). Tests that
	// check append rules and recovery, not the disk, run faster without.
	Durable bool
}

// Start initialises and starts a throwaway server. Stop it with Stop.
func Start(o Options) (*Server, error) {
	bin, err := findBin()
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin}
	if os.Geteuid() == 0 {
		if s.cred, err = unprivileged(); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "polyloop-pg-")
	if err != nil {
		return nil, err
	}
	s.dir = dir
	// As root, the directory stays root's while the cluster is put in it
	// (the server's user may pass through it, for initdb, but not write
	// it: nothing it plants there is followed), and is the server's user's
	// once the cluster is whole.
	if s.cred != nil {
		if err := os.Chmod(dir, 0o711); err != nil {
			s.remove()
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	if s.made, err = s.fromTemplate(data); err != nil {
		s.made = fmt.Sprintf("by initdb (the template cluster: %v)", err)
		os.RemoveAll(data)
		if s.Password, err = s.initdb(data); err != nil {
			s.remove()
			return nil, err
		}
	}
	if s.cred != nil {
		err = errors.Join(os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)), os.Chmod(dir, 0o700))
		if err != nil {
			s.remove()
			return nil, err
		}
	}
	fsync := "fsync=off"
	if o.Durable {
		fsync = "fsync=on"
	}
	s.opts = []string{"-D", data, "-k", dir, "-c", "listen_addresses=", "-c", fsync,
		"-c", "max_connections=200", "-c", "shared_buffers=128MB"}
	if err := s.start(); err != nil {
		s.remove()
		return nil, err
	}
	s.DSN = "postgres://postgres:" + s.Password + "@/postgres?host=" + url.QueryEscape(dir) + "&sslmode=disable"
	return s, nil
}

// initdb makes a cluster in data (which must not exist) whose superuser
// postgres has a new password, which it returns.
func (s *Server) initdb(data string) (password string, err error) {
	// A password, so tests can present a wrong one. initdb is given its
	// SCRAM secret, which the server stores as it is (see scramSecret).
	password = fmt.Sprintf("pw%d", time.Now().UnixNano())
	salt := make([]byte, 16)
	rand.Read(salt)
	secret, err := scramSecret(password, salt, scramIterations)
	if err != nil {
		return "", err
	}
	pwfile := filepath.Join(s.dir, "pwfile")
	f, err := os.OpenFile(pwfile, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return "", err
	}
	defer os.Remove(pwfile)
	_, err = f.WriteString(secret + "\n")
	if err == nil && s.cred != nil {
		// initdb runs as the server's user: the file is given to it, and
		// so is the cluster's directory, made for it (s.dir is root's).
		err = f.Chown(int(s.cred.Uid), int(s.cred.Gid))
		if err == nil {
			err = os.Mkdir(data, 0o700)
		}
		if err == nil {
			err = os.Chown(data, int(s.cred.Uid), int(s.cred.Gid))
		}
	}
	if err = errors.Join(err, f.Close()); err != nil {
		return "", err
	}
	out, err := s.run("initdb", "-D", data, "-U", "postgres", "-A", "scram-sha-256", "--pwfile", pwfile, "-E", "UTF8", "--no-sync")
	if err != nil {
		return "", fmt.Errorf("pgtest: initdb: %v\n%s", err, out)
	}
	return password, nil
}

// start runs postgres as a child of a goroutine locked to its OS thread,
// with a parent-death signal: if the test process dies (a timeout, a
// panic, a kill), the kernel sends the server SIGQUIT and it goes too,
// instead of living on detached as pg_ctl would leave it. It returns once
// the server accepts connections.
func (s *Server) start() error {
	// Not followed if it is a link: s.dir is the server's user's.
	log, err := os.OpenFile(filepath.Join(s.dir, "log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), s.opts...)
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGQUIT}
	started, exited := make(chan error, 1), make(chan struct{})
	go func() {
		// Pdeathsig fires when the starting thread ends: this goroutine
		// keeps its thread until the server has exited.
		runtime.LockOSThread()
		defer log.Close()
		if err := cmd.Start(); err != nil {
			started <- err
			runtime.UnlockOSThread()
			close(exited)
			return
		}
		started <- nil
		cmd.Wait()
		runtime.UnlockOSThread()
		close(exited)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}
	s.proc, s.exited = cmd.Process, exited
	pidFile := filepath.Join(s.opts[1], "postmaster.pid")
	deadline := time.Now().Add(60 * time.Second)
	for {
		// The eighth line of postmaster.pid says "ready" once the server
		// accepts connections.
		if b, err := os.ReadFile(pidFile); err == nil {
			if lines := strings.Split(string(b), "\n"); len(lines) > 7 && strings.TrimSpace(lines[7]) == "ready" {
				return nil
			}
		}
		select {
		case <-exited:
			out, _ := os.ReadFile(filepath.Join(s.dir, "log"))
			return fmt.Errorf("pgtest: postgres exited while starting:\n%s", out)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.signal(syscall.SIGQUIT)
			return errors.New("pgtest: postgres did not get ready within 60s")
		}
	}
}

// signal sends sig to the server and waits (up to a minute, then kills it)
// for it to exit.
func (s *Server) signal(sig syscall.Signal) {
	s.proc.Signal(sig)
	select {
	case <-s.exited:
	case <-time.After(time.Minute):
		s.proc.Kill()
		<-s.exited
	}
}

// Pid is the server's process id.
func (s *Server) Pid() int { return s.proc.Pid }

// Restart stops the server (fast shutdown: connections are dropped) and
// starts it again on the same socket and data.
func (s *Server) Restart() error {
	s.signal(syscall.SIGINT)
	return s.start()
}

// Stop stops the server (immediate shutdown) and removes its directory.
func (s *Server) Stop() error {
	s.signal(syscall.SIGQUIT)
	s.remove()
	return nil
}

func (s *Server) remove() { os.RemoveAll(s.dir) }

// run runs one of the server's programs as the server's user.
func (s *Server) run(prog string, args ...string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(s.bin, prog), args...)
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	return cmd.CombinedOutput()
}

// findBin finds the directory of initdb: PATH first, then Debian's layout,
// newest version first.
func findBin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", ErrNotInstalled
}

// ErrNotInstalled: no PostgreSQL to start a throwaway server from. Tests
// wanting a server skip for it, and only for it (Unavailable).
var ErrNotInstalled = errors.New("pgtest: initdb not found on PATH or in /usr/lib/postgresql/*/bin")

func version(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// unprivileged is the user "postgres", created when missing.
func unprivileged() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "postgres").CombinedOutput(); err != nil {
			return nil, fmt.Errorf("pgtest: running as root and no user postgres to run the server as; useradd: %v: %s", err, out)
		}
		if u, err = user.Lookup("postgres"); err != nil {
			return nil, err
		}
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// shared is the test binary's server, started on first use; durable is
// the benchmarks' one, with fsync on.
var shared, durable struct {
	once sync.Once
	srv  *Server
	dsn  string
	err  error
}

// DSN returns the DSN of a server for t: POLYLOOP_PG_DSN, or the test
// binary's throwaway server (started on first use, stopped by Main). It
// skips t when there is none, or fails it when POLYLOOP_PG_REQUIRED is set.
func DSN(t testing.TB) string {
	t.Helper()
	dsn, err := Lookup()
	if err != nil {
		Unavailable(t, err)
	}
	return dsn
}

// Lookup is DSN without a test: the server's DSN, or why there is none.
func Lookup() (string, error) {
	shared.once.Do(func() { shared.dsn, shared.srv, shared.err = lookup(Options{}) })
	return shared.dsn, shared.err
}

// DurableDSN is DSN for benchmarks: a throwaway server with fsync on, so
// commits cost what they cost (or POLYLOOP_PG_DSN's server as it is).
func DurableDSN(t testing.TB) string {
	t.Helper()
	durable.once.Do(func() { durable.dsn, durable.srv, durable.err = lookup(Options{Durable: true}) })
	if durable.err != nil {
		Unavailable(t, durable.err)
	}
	return durable.dsn
}

func lookup(o Options) (string, *Server, error) {
	if dsn := os.Getenv(DSNEnv); dsn != "" {
		return dsn, nil, nil
	}
	if _, err := findBin(); err != nil {
		return "", nil, err
	}
	start := time.Now()
	srv, err := Start(o)
	if err != nil {
		return "", nil, err
	}
	fmt.Fprintf(os.Stderr, "pgtest: throwaway PostgreSQL (fsync %v) started in %v, its cluster made %s\n", o.Durable, time.Since(start).Round(time.Millisecond), srv.made)
	return srv.DSN, srv, nil
}

// Unavailable skips t for want of a server when PostgreSQL is not
// installed (err wraps ErrNotInstalled), and fails it otherwise: when
// POLYLOOP_PG_REQUIRED is set, and when PostgreSQL is installed but its
// server could not be had — a broken setup must not read as a missing one
// (a misplaced server option once skipped every PostgreSQL benchmark).
func Unavailable(t testing.TB, err error) {
	t.Helper()
	if skip, why := unavailable(err); !skip {
		t.Fatal(why)
	}
	t.Skipf("%s (%v)", SkipHint, err)
}

// unavailable decides for Unavailable: skip, or fail saying why.
func unavailable(err error) (skip bool, why string) {
	return unavailableFor(err, required())
}

// required reports whether RequiredEnv makes a missing server a failure.
func required() bool {
	v := os.Getenv(RequiredEnv)
	return v != "" && v != "0"
}

// unavailableFor is unavailable with RequiredEnv's answer given.
func unavailableFor(err error, required bool) (skip bool, why string) {
	if required {
		return false, fmt.Sprintf("%s is set but no PostgreSQL server could be had: %v", RequiredEnv, err)
	}
	if !errors.Is(err, ErrNotInstalled) {
		return false, fmt.Sprintf("PostgreSQL is installed but no server could be had: %v", err)
	}
	return true, ""
}

// Main runs the tests and stops the throwaway server if one was started:
// call it from TestMain as os.Exit(pgtest.Main(m)).
//
// examples names the package's Example functions that need a server
// (they get its DSN from Lookup). An example cannot skip itself, so where
// the tests skip for want of PostgreSQL — it is not installed and
// POLYLOOP_PG_REQUIRED is unset — Main leaves the ones the run selects out
// of it, adding them to -test.skip, and says so on stderr; anywhere else
// they run, and fail when no server can be had, saying why. Main looks
// for a server before the run only when the run selects one of them.
func Main(m *testing.M, examples ...string) int {
	if len(examples) > 0 {
		if !flag.Parsed() {
			flag.Parse()
		}
		skip, said := leaveOut(examples, flagValue("test.run"), flagValue("test.skip"), required(), func() error {
			_, err := Lookup()
			return err
		})
		if said != "" {
			fmt.Fprintln(os.Stderr, "pgtest:", said)
		}
		if skip != flagValue("test.skip") {
			flag.Set("test.skip", skip)
		}
	}
	code := m.Run()
	dropper.close()
	for _, srv := range []*Server{shared.srv, durable.srv} {
		if srv != nil {
			if err := srv.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
		}
	}
	return code
}

// Schema is a schema name no other test of this process uses, derived from
// t's name: each test gets its own tables in a shared server. The schema
// is dropped when t ends, so a long-lived server (POLYLOOP_PG_DSN) does not
// collect them.
func Schema(t testing.TB) string {
	name := schemaName(t)
	t.Cleanup(func() { dropSchema(name) })
	return name
}

// dropSchema drops name, with everything in it, from the servers in use.
func dropSchema(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	seen := map[string]bool{}
	for _, dsn := range []string{shared.dsn, durable.dsn} {
		if dsn == "" || seen[dsn] {
			continue
		}
		seen[dsn] = true
		dropper.exec(ctx, dsn, `DROP SCHEMA IF EXISTS `+pgx.Identifier{name}.Sanitize()+` CASCADE`)
	}
}

// dropper keeps one connection per server for the drops: a connection is
// a server process forked and initialised, and a connection per test's
// drop was more than a quarter of the connections pgstore's tests made.
var dropper = conns{byDSN: map[string]*pgx.Conn{}}

type conns struct {
	sync.Mutex
	byDSN map[string]*pgx.Conn
}

// exec runs sql on dsn's kept connection, connecting (again, once, if the
// kept one failed: a restarted server) as needed. A failed drop leaves
// the schema behind, which harms nothing: names are never reused.
func (c *conns) exec(ctx context.Context, dsn, sql string) {
	c.Lock()
	defer c.Unlock()
	for range 2 {
		conn := c.byDSN[dsn]
		if conn == nil {
			var err error
			if conn, err = pgx.Connect(ctx, dsn); err != nil {
				return
			}
			c.byDSN[dsn] = conn
		}
		if _, err := conn.Exec(ctx, sql); err == nil {
			return
		}
		conn.Close(ctx)
		delete(c.byDSN, dsn)
	}
}

// close closes the kept connections.
func (c *conns) close() {
	c.Lock()
	defer c.Unlock()
	for dsn, conn := range c.byDSN {
		conn.Close(context.Background())
		delete(c.byDSN, dsn)
	}
}

func schemaName(t testing.TB) string {
	schemaSeq.Lock()
	schemaSeq.n++
	n := schemaSeq.n
	schemaSeq.Unlock()
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return '_'
	}, t.Name())
	if len(name) > 40 {
		name = name[:40]
	}
	return fmt.Sprintf("t%d_%d_%s", os.Getpid(), n, name)
}

var schemaSeq struct {
	sync.Mutex
	n int
}

// StoreURL is DSN(t) naming a schema of t's own (Schema(t)) with the
// polyloop_schema parameter, as a user would pass it to polyloop-inspect.
func StoreURL(t testing.TB) string {
	t.Helper()
	dsn := DSN(t)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + pgstore.SchemaParam + "=" + Schema(t)
}

// StoreForms is StoreURL(t) written in every form a connection string may
// take: the URL, the URL with its scheme in capitals, and libpq's
// keyword/value string (every value quoted). All three name one store.
// password is the one they hold; t is skipped when the server's DSN is not
// a URL holding one (a POLYLOOP_PG_DSN without it), since tests that look
// for it in what commands print need it.
func StoreForms(t testing.TB) (password string, forms []string) {
	t.Helper()
	target := StoreURL(t)
	u, err := url.Parse(target)
	if err != nil || u.User == nil {
		t.Skipf("the server's DSN is not a URL with a user and password")
	}
	password, ok := u.User.Password()
	if !ok || password == "" {
		t.Skipf("the server's DSN holds no password")
	}
	quote := func(v string) string {
		return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
	}
	kv := []string{"user=" + quote(u.User.Username()), "password=" + quote(password)}
	if db := strings.TrimPrefix(u.Path, "/"); db != "" {
		kv = append(kv, "dbname="+quote(db))
	}
	if h := u.Hostname(); h != "" {
		kv = append(kv, "host="+quote(h))
	}
	if p := u.Port(); p != "" {
		kv = append(kv, "port="+quote(p))
	}
	q := u.Query()
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		kv = append(kv, k+"="+quote(q.Get(k)))
	}
	scheme, rest, _ := strings.Cut(target, "://")
	return password, []string{target, strings.ToUpper(scheme) + "://" + rest, strings.Join(kv, " ")}
}

// scramIterations is the PBKDF2 iteration count of the throwaway server's
// password, where PostgreSQL's default is 4,096. Every connection a test
// opens makes the client compute PBKDF2 with it; under the race detector
// 4,096 iterations took seconds of each PostgreSQL test package's CPU.
// The server guards nothing a guessed password would expose (a Unix
// socket in a private directory, a cluster deleted after the tests);
// authentication itself is unchanged, SCRAM-SHA-256 with a password the
// tests present.
const scramIterations = 1

// scramSecret is the SCRAM-SHA-256 secret of password (RFC 5802, RFC 7677)
// in PostgreSQL's stored form, "SCRAM-SHA-256$ITERATIONS:SALT$STOREDKEY:
// SERVERKEY". Given a password in this form, PostgreSQL stores it as it
// is instead of hashing it with its own iteration count.
func scramSecret(password string, salt []byte, iterations int) (string, error) {
	salted, err := pbkdf2.Key(sha256.New, password, salt, iterations, sha256.Size)
	if err != nil {
		return "", fmt.Errorf("pgtest: scram secret: %w", err)
	}
	mac := func(msg string) []byte {
		h := hmac.New(sha256.New, salted)
		h.Write([]byte(msg))
		return h.Sum(nil)
	}
	stored := sha256.Sum256(mac("Client Key"))
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", iterations, b64(salt), b64(stored[:]), b64(mac("Server Key"))), nil
}
