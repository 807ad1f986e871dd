package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
)

// exec runs sql on the test server (the test's own connection, not the
// store's), with the schema's name for {{schema}}.
func exec(t testing.TB, schema, sql string, args ...any) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	sql = strings.ReplaceAll(sql, "{{schema}}", pgx.Identifier{schema}.Sanitize())
	if _, err := conn.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// TestConcurrentOpensMigrateOnce: eight workers opening a fresh schema at
// once all succeed, and each migration is recorded once.
func TestConcurrentOpensMigrateOnce(t *testing.T) {
	dsn, schema := pgtest.DSN(t), pgtest.Schema(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			s, err := pgstore.Open(context.Background(), dsn, pgstore.Options{Schema: schema})
			if err == nil {
				s.Close()
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n, max int
	if err := conn.QueryRow(context.Background(), `SELECT count(*), max(version) FROM `+pgx.Identifier{schema, "schema_migrations"}.Sanitize()).Scan(&n, &max); err != nil {
		t.Fatal(err)
	}
	if n != pgstore.SchemaVersion || max != pgstore.SchemaVersion {
		t.Fatalf("%d migrations recorded, last %d; want %d", n, max, pgstore.SchemaVersion)
	}
}

// TestSchemaVersionsAreChecked: a newer schema is refused naming both
// versions; a read-only store refuses a schema it would have to create.
func TestSchemaVersionsAreChecked(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	s := open(t, pgstore.Options{})
	exec(t, s.Schema(), `INSERT INTO {{schema}}.schema_migrations (version, name) VALUES (99, 'from the future')`)
	for _, ro := range []bool{false, true} {
		_, err := pgstore.Open(ctx, dsn, pgstore.Options{Schema: s.Schema(), ReadOnly: ro})
		want := fmt.Sprintf("at version 99, this package reads and writes version %d", pgstore.SchemaVersion)
		if !errors.Is(err, pgstore.ErrSchemaVersion) || !strings.Contains(fmt.Sprint(err), want) {
			t.Errorf("read-only %v: newer schema opened with %v", ro, err)
		}
	}
	_, err := pgstore.Open(ctx, dsn, pgstore.Options{Schema: pgtest.Schema(t), ReadOnly: true})
	if !errors.Is(err, pgstore.ErrSchemaVersion) || !strings.Contains(fmt.Sprint(err), "holds no PolyLoop store") {
		t.Errorf("read-only open of an empty schema: %v", err)
	}
}

// TestReadOnlyStoreWritesNothing: Append fails with ErrReadOnly, Migrate
// too, while reading works.
func TestReadOnlyStoreWritesNothing(t *testing.T) {
	ctx := context.Background()
	w := open(t, pgstore.Options{})
	if _, err := w.Append(ctx, "r", ulid.ULID{}, events.RunStarted{RunID: "r", SchemaVersion: events.CurrentSchemaVersion}); err != nil {
		t.Fatal(err)
	}
	r := open(t, pgstore.Options{Schema: w.Schema(), ReadOnly: true})
	if _, err := r.Append(ctx, "s", ulid.ULID{}, events.RunStarted{RunID: "s", SchemaVersion: events.CurrentSchemaVersion}); !errors.Is(err, pgstore.ErrReadOnly) {
		t.Fatalf("append on a read-only store: %v", err)
	}
	if err := r.Migrate(ctx); !errors.Is(err, pgstore.ErrReadOnly) {
		t.Fatalf("migrate on a read-only store: %v", err)
	}
	if got, err := r.Load(ctx, "r"); err != nil || len(got) != 1 {
		t.Fatalf("load: %d events, %v", len(got), err)
	}
	if runs, err := r.Runs(ctx); err != nil || len(runs) != 1 || runs[0].RunID != "r" || runs[0].Events != 1 {
		t.Fatalf("runs: %+v, %v", runs, err)
	}
}

// TestConnectionFailuresAreClear: an unreachable server fails within the
// connect timeout naming the host; a wrong password, an unknown user and a
// missing database each say so; the password is never echoed.
func TestConnectionFailuresAreClear(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	with := func(f func(u *url.URL)) string {
		c := *u
		f(&c)
		return c.String()
	}
	// A listener that accepts and never answers: a server that hangs.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	host, port, _ := net.SplitHostPort(l.Addr().String())
	cases := []struct {
		name, dsn string
		want      []string
	}{
		{"silent server", "postgres://u:secret@" + host + ":" + port + "/db?sslmode=disable",
			[]string{"host=127.0.0.1", "port=" + port, "within the 300ms connect timeout"}},
		{"wrong password", with(func(u *url.URL) { u.User = url.UserPassword("postgres", "secret") }),
			[]string{"authentication failed", "user=postgres"}},
		{"unknown user", with(func(u *url.URL) { u.User = url.UserPassword("nobody", "secret") }),
			[]string{"authentication failed", "user=nobody"}},
		{"missing database", with(func(u *url.URL) { u.Path = "/no_such_db" }),
			[]string{"database=no_such_db", "the database does not exist"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			_, err := pgstore.Open(ctx, c.dsn, pgstore.Options{ConnectTimeout: 300 * time.Millisecond})
			if err == nil {
				t.Fatal("opened")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("error %q shows the password", err)
			}
			if d := time.Since(start); d > 20*time.Second {
				t.Errorf("took %v", d) // a hang, not a timing assertion
			}
		})
	}
}

// TestKeysIncreaseWhenTheClockStepsBack: a writer whose clock is an hour
// behind the stream's keys still appends after them.
func TestKeysIncreaseWhenTheClockStepsBack(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgstore.Options{})
	envs, err := s.Append(ctx, "c", ulid.ULID{}, events.RunStarted{RunID: "c", SchemaVersion: events.CurrentSchemaVersion})
	if err != nil {
		t.Fatal(err)
	}
	late := open(t, pgstore.Options{Schema: s.Schema()})
	pgstore.SetClock(late, func() time.Time { return time.Now().Add(-time.Hour) })
	more, err := late.Append(ctx, "c", envs[0].ID, events.Intent{RunID: "c", IntentKind: events.IntentModelCall, ResultID: "m0", ReplayPolicy: events.ReplaySafe})
	if err != nil {
		t.Fatal(err)
	}
	if more[0].ID.Compare(envs[0].ID) <= 0 {
		t.Fatalf("key %s minted after %s", more[0].ID, envs[0].ID)
	}
	if got, err := s.Load(ctx, "c"); err != nil || len(got) != 2 {
		t.Fatalf("load: %d, %v", len(got), err)
	}
}

// TestRunIDsPostgresCannotKeepAreRefused: a clear error from Append and
// LockRun (and DeleteRun, which locks), wrapping seams.ErrInvalidRunID,
// nothing written.
func TestRunIDsPostgresCannotKeepAreRefused(t *testing.T) {
	s := open(t, pgstore.Options{})
	for id, want := range map[string]string{
		strings.Repeat("x", seams.MaxRunIDBytes+1): "1025 bytes, longer than the 1024-byte limit",
		"a\x00b": "NUL byte",
		"\xff":   "not valid UTF-8",
	} {
		_, err := s.Append(context.Background(), id, ulid.ULID{}, events.RunStarted{RunID: id, SchemaVersion: events.CurrentSchemaVersion})
		if !errors.Is(err, seams.ErrInvalidRunID) || !strings.Contains(err.Error(), want) {
			t.Errorf("append: %v, want %q", err, want)
		}
		if _, err := s.LockRun(id); !errors.Is(err, seams.ErrInvalidRunID) || !strings.Contains(err.Error(), want) {
			t.Errorf("lock: %v, want %q", err, want)
		}
		if err := s.DeleteRun(context.Background(), id, true); !errors.Is(err, seams.ErrInvalidRunID) || !strings.Contains(err.Error(), want) {
			t.Errorf("delete: %v, want %q", err, want)
		}
	}
	if runs, err := s.Runs(context.Background()); err != nil || len(runs) != 0 {
		t.Fatalf("runs: %v %v", runs, err)
	}
}

// TestRunLeasesHoldAcrossProcesses: a run leased through one store (one
// process's pool) is refused through another, naming the holder, until
// released, or until the holder's lease expires (a dead worker's run is
// not left behind); a store in another schema is not blocked.
func TestRunLeasesHoldAcrossProcesses(t *testing.T) {
	ctx := context.Background()
	a := open(t, pgstore.Options{})
	b := open(t, pgstore.Options{Schema: a.Schema(), LeaseDuration: time.Second})
	proptest.AppendEach(t, a, "r", proptest.SoundStream("r")[:3])
	release, err := a.LockRun("r")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.LockRun("r"); !errors.Is(err, seams.ErrRunLocked) || !strings.Contains(err.Error(), a.Owner()) {
		t.Fatalf("second process locked a held run: %v", err)
	}
	if _, err := a.LockRun("r"); !errors.Is(err, seams.ErrRunLocked) || !strings.Contains(err.Error(), "this process") {
		t.Fatalf("second lock in the holding process: %v", err)
	}
	other := open(t, pgstore.Options{Schema: pgtest.Schema(t)})
	proptest.AppendEach(t, other, "r", proptest.SoundStream("r")[:3])
	if rel, err := other.LockRun("r"); err != nil {
		t.Fatalf("a store in another schema is blocked by this one's lease: %v", err)
	} else {
		rel()
	}
	release()
	release() // safe twice
	if err := a.HoldsRun(ctx, "r"); !errors.Is(err, seams.ErrRunLocked) {
		t.Fatalf("HoldsRun after release: %v", err)
	}
	if _, err := b.LockRun("r"); err != nil {
		t.Fatalf("after release: %v", err)
	}
	// The holder stops renewing (it died, or was cut off): a second later
	// its lease expires and another takes the run.
	pgstore.StopRenewing(b)
	start := time.Now()
	for {
		rel, err := a.LockRun("r")
		if err == nil {
			rel()
			break
		}
		if !errors.Is(err, seams.ErrRunLocked) || time.Since(start) > 10*time.Second {
			t.Fatalf("a dead holder's lease was left behind: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if time.Since(start) < 500*time.Millisecond {
		t.Fatalf("the lease of a live holder was taken after %v", time.Since(start))
	}
	if err := b.HoldsRun(ctx, "r"); !errors.Is(err, seams.ErrRunLocked) {
		t.Fatalf("the old holder still believes it holds the run: %v", err)
	}
}

// TestThePoolSizeIsResolved: Options.MaxConns when set, else the DSN's
// pool_max_conns, else DefaultMaxConns.
func TestThePoolSizeIsResolved(t *testing.T) {
	u, err := url.Parse(pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("pool_max_conns", "5")
	u.RawQuery = q.Encode()
	withPoolSize := u.String()
	for _, c := range []struct {
		dsn      string
		maxConns int32
		want     int32
	}{
		{pgtest.DSN(t), 0, pgstore.DefaultMaxConns},
		{pgtest.DSN(t), 3, 3},
		{withPoolSize, 0, 5},
		{withPoolSize, 7, 7},
	} {
		s, err := pgstore.Open(context.Background(), c.dsn, pgstore.Options{MaxConns: c.maxConns, Schema: pgtest.Schema(t)})
		if err != nil {
			t.Fatal(err)
		}
		got := pgstore.PoolSize(s)
		s.Close()
		if got != c.want {
			t.Errorf("MaxConns %d, DSN with pool_max_conns=%v: a pool of %d, want %d", c.maxConns, c.dsn == withPoolSize, got, c.want)
		}
	}
}

// TestALeasedRunHoldsNoConnection: with a pool of one connection, a run
// this process holds is loaded, appended to and refused, each statement
// taking the one connection and giving it back.
func TestALeasedRunHoldsNoConnection(t *testing.T) {
	s := open(t, pgstore.Options{MaxConns: 1})
	release, err := s.LockRun("r")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s.Load(ctx, "r"); err != nil {
		t.Fatalf("load of a locked run: %v", err)
	}
	envs, err := s.Append(ctx, "r", ulid.ULID{}, events.RunStarted{RunID: "r", SchemaVersion: events.CurrentSchemaVersion})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, "r", ulid.ULID{}, events.RunStarted{RunID: "r", SchemaVersion: events.CurrentSchemaVersion}); !errors.Is(err, seams.ErrRunExists) {
		t.Fatalf("refused append of a locked run: %v", err)
	}
	if got, err := s.Load(ctx, "r"); err != nil || len(got) != 1 || got[0].ID != envs[0].ID {
		t.Fatalf("load: %v %v", got, err)
	}
}

// TestOverlongSchemaNamesAreRefused: PostgreSQL would cut the name to 63
// bytes, and two stores could share tables under different locks.
func TestOverlongSchemaNamesAreRefused(t *testing.T) {
	_, err := pgstore.Open(context.Background(), pgtest.DSN(t), pgstore.Options{Schema: strings.Repeat("s", 64)})
	if err == nil || !strings.Contains(err.Error(), "PostgreSQL keeps only 63") {
		t.Fatalf("open: %v", err)
	}
}

// TestAWorkerWithoutCreateRightsOpensAMigratedStore: a role that may use
// the tables but not create schemas opens a store already migrated.
func TestAWorkerWithoutCreateRightsOpensAMigratedStore(t *testing.T) {
	admin := open(t, pgstore.Options{})
	role := "worker_" + strings.ToLower(ulid.Make().String()[20:])
	exec(t, admin.Schema(), `CREATE ROLE `+role+` LOGIN PASSWORD 'w0rker';
GRANT USAGE ON SCHEMA {{schema}} TO `+role+`;
GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA {{schema}} TO `+role)
	u, err := url.Parse(pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, "w0rker")
	w, err := pgstore.Open(context.Background(), u.String(), pgstore.Options{Schema: admin.Schema()})
	if err != nil {
		t.Fatalf("a least-privilege worker: %v", err)
	}
	defer w.Close()
	if _, err := w.Append(context.Background(), "r", ulid.ULID{}, events.RunStarted{RunID: "r", SchemaVersion: events.CurrentSchemaVersion}); err != nil {
		t.Fatal(err)
	}
}

// TestATailNoKeyCanFollowIsRefused: the largest ULID named as the tail is
// refused like any tail that is not the stream's (kv does the same), not a
// panic minting the next key.
func TestATailNoKeyCanFollowIsRefused(t *testing.T) {
	s := open(t, pgstore.Options{})
	max := ulid.ULID{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	_, err := s.Append(context.Background(), "r", max, events.Intent{RunID: "r", IntentKind: events.IntentModelCall, ResultID: "m", ReplayPolicy: events.ReplaySafe})
	if !errors.Is(err, seams.ErrTailMoved) {
		t.Fatalf("append after the largest key: %v", err)
	}
}

// TestConnectionStringsThatDoNotParseAreNotEchoed: Open's error for a
// connection string pgx cannot parse says why, without the string (pgx's
// own masking of a malformed one leaves part of a password).
func TestConnectionStringsThatDoNotParseAreNotEchoed(t *testing.T) {
	for dsn, want := range map[string]string{
		"host=h port=x password=Pa55-w0rd":  "invalid port",
		"host=h port=1 password='Pa55 w0rd": "unterminated quoted string",
		"postgres://u:Pa55-w0rd@h:x/db":     "invalid port",
	} {
		_, err := pgstore.Open(context.Background(), dsn, pgstore.Options{})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", dsn, err, want)
			continue
		}
		for _, part := range []string{"Pa55", "w0rd", "host=h"} {
			if strings.Contains(err.Error(), part) {
				t.Errorf("%s: the error shows %q: %v", dsn, part, err)
			}
		}
	}
}

// tcpProxy forwards connections to 127.0.0.1:port to the server dsn names
// (the throwaway server listens on a Unix socket only), so a client can
// reach it over TCP, where pgx first asks for TLS.
func tcpProxy(t *testing.T, dsn string) (port string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Skipf("the server's DSN is not a URL: %v", err)
	}
	network, addr := "tcp", u.Host
	if h := u.Query().Get("host"); strings.HasPrefix(h, "/") {
		p := u.Port()
		if p == "" {
			p = "5432"
		}
		network, addr = "unix", h+"/.s.PGSQL."+p
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial(network, addr)
			if err != nil {
				c.Close()
				continue
			}
			go func() { io.Copy(s, c); s.Close() }()
			go func() { io.Copy(c, s); c.Close() }()
		}
	}()
	_, port, _ = net.SplitHostPort(l.Addr().String())
	return port
}

// TestConnectionErrorsLeadWithTheCause: connecting over TCP (pgx asks for
// TLS first, and the server refuses) to a database that does not exist
// fails with one line that says so first — the server's own error, not
// the refused TLS attempt, and no line breaks of pgx's list of attempts.
func TestConnectionErrorsLeadWithTheCause(t *testing.T) {
	dsn := pgtest.DSN(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Skipf("the server's DSN is not a URL: %v", err)
	}
	port := tcpProxy(t, dsn)
	password, _ := u.User.Password()
	target := (&url.URL{Scheme: "postgres", User: url.UserPassword(u.User.Username(), password), Host: "127.0.0.1:" + port, Path: "/nodb"}).String()
	_, err = pgstore.Open(context.Background(), target, pgstore.Options{ConnectTimeout: 5 * time.Second})
	if err == nil {
		t.Fatal("opened a database that does not exist")
	}
	msg := err.Error()
	cause := strings.Index(msg, `database "nodb" does not exist`)
	if cause < 0 || strings.ContainsAny(msg, "\n\t") || !strings.Contains(msg, "the database does not exist") {
		t.Fatalf("error %q: want one line naming the missing database", msg)
	}
	if tls := strings.Index(msg, "tls"); tls >= 0 && tls < cause {
		t.Fatalf("error %q leads with the refused TLS attempt, not the cause", msg)
	}
	if password != "" && strings.Contains(msg, password) {
		t.Fatalf("error %q shows the password", msg)
	}
}

// TestLeaseOptionsComeFromTheDSN: polyloop_owner and polyloop_lease set
// the owner and the lease's term when the options do not, are not sent
// to the server, and a lease that is not a duration, or too short to
// renew, is refused with the reason.
func TestLeaseOptionsComeFromTheDSN(t *testing.T) {
	u, err := url.Parse(pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	with := func(params ...string) string {
		q := u.Query()
		for i := 0; i < len(params); i += 2 {
			q.Set(params[i], params[i+1])
		}
		v := *u
		v.RawQuery = q.Encode()
		return v.String()
	}
	s, err := pgstore.Open(context.Background(), with(pgstore.OwnerParam, "worker-7", pgstore.LeaseParam, "5s"), pgstore.Options{Schema: pgtest.Schema(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !strings.HasPrefix(s.Owner(), "worker-7/") {
		t.Fatalf("owner %q, want the DSN's worker-7 and a suffix", s.Owner())
	}
	s2, err := pgstore.Open(context.Background(), with(pgstore.OwnerParam, "worker-7"), pgstore.Options{Schema: s.Schema(), Owner: "mine"})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if !strings.HasPrefix(s2.Owner(), "mine/") {
		t.Fatalf("owner %q, want the option's and a suffix", s2.Owner())
	}
	// Two stores given one name (a fleet sharing one connection string)
	// are still two workers: one's lease refuses the other.
	s3, err := pgstore.Open(context.Background(), with(pgstore.OwnerParam, "worker-7"), pgstore.Options{Schema: s.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	proptest.AppendEach(t, s, "r", proptest.SoundStream("r")[:2])
	release, err := s.LockRun("r")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if _, err := s3.LockRun("r"); !errors.Is(err, seams.ErrRunLocked) {
		t.Fatalf("a store under the same name took a held run: %v", err)
	}
	for _, c := range []struct{ lease, want string }{
		{"soon", `polyloop_lease="soon" is not a duration`},
		{"10ms", "too short to renew"},
	} {
		_, err := pgstore.Open(context.Background(), with(pgstore.LeaseParam, c.lease), pgstore.Options{Schema: s.Schema()})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("lease %q: %v, want %q", c.lease, err, c.want)
		}
	}
}

// TestTheFinishingAppendGivesTheLeaseBack: the append that finishes a run
// clears its lease in the same statement, so a holder that dies right
// after (it never releases) leaves the run free at once.
func TestTheFinishingAppendGivesTheLeaseBack(t *testing.T) {
	a := open(t, pgstore.Options{})
	b := open(t, pgstore.Options{Schema: a.Schema()})
	stream := proptest.SoundStream("f")
	proptest.AppendEach(t, a, "f", stream[:3])
	if _, err := a.LockRun("f"); err != nil { // never released
		t.Fatal(err)
	}
	pgstore.StopRenewing(a)
	got, err := a.Load(context.Background(), "f")
	if err != nil {
		t.Fatal(err)
	}
	tail := got[len(got)-1].ID
	for _, ev := range stream[3:] {
		envs, err := a.Append(context.Background(), "f", tail, ev)
		if err != nil {
			t.Fatal(err)
		}
		tail = envs[0].ID
	}
	release, err := b.LockRun("f")
	if err != nil {
		t.Fatalf("a finished run's lease outlived its last append: %v", err)
	}
	release()
}

// TestARunReservedBeforeItHadARowTakesItsLeaseLater: a run reserved
// while it had no index row, then started by a writer that holds no
// lease, is continued by its reserver, who takes the lease then; had a
// live worker leased it meanwhile, the reserver would be refused.
func TestARunReservedBeforeItHadARowTakesItsLeaseLater(t *testing.T) {
	ctx := context.Background()
	a := open(t, pgstore.Options{})
	other := open(t, pgstore.Options{Schema: a.Schema()})
	release, err := a.LockRun("r") // no row: reserved in this process only
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	proptest.AppendEach(t, other, "r", proptest.SoundStream("r")[:2]) // started without a lease
	got, err := a.Load(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Append(ctx, "r", got[len(got)-1].ID, proptest.SoundStream("r")[2]); err != nil {
		t.Fatalf("the reserver's continuation: %v", err)
	}
	if err := a.HoldsRun(ctx, "r"); err != nil {
		t.Fatalf("the reserver does not hold the run it continued: %v", err)
	}
	if _, err := other.LockRun("r"); !errors.Is(err, seams.ErrRunLocked) {
		t.Fatalf("another worker took the run the reserver holds: %v", err)
	}

	// Leased by a live worker in between: the reserver is refused.
	b := open(t, pgstore.Options{Schema: a.Schema()})
	releaseS, err := a.LockRun("s")
	if err != nil {
		t.Fatal(err)
	}
	defer releaseS()
	proptest.AppendEach(t, other, "s", proptest.SoundStream("s")[:2])
	if _, err := b.LockRun("s"); err != nil {
		t.Fatal(err)
	}
	got, err = a.Load(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Append(ctx, "s", got[len(got)-1].ID, proptest.SoundStream("s")[2]); !errors.Is(err, seams.ErrRunLocked) {
		t.Fatalf("the reserver's continuation of a run a live worker leased: %v, want ErrRunLocked", err)
	}
}
