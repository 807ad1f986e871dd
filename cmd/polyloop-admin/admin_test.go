package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/stores"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// fill writes finished runs f-0…f-(n-1) and one unfinished run "u".
func fill(t *testing.T, s seams.RunStore, n int) {
	t.Helper()
	for i := range n {
		proptest.AppendEach(t, s, fmt.Sprint("f-", i), proptest.SoundStream(fmt.Sprint("f-", i)))
	}
	proptest.AppendEach(t, s, "u", proptest.SoundStream("u")[:3])
}

func admin(args ...string) (int, string) {
	var out, errOut strings.Builder
	code := run(args, &out, &errOut)
	return code, out.String() + errOut.String()
}

func runIDs(t *testing.T, target string) string {
	s, err := stores.Open(context.Background(), target, stores.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	runs, err := s.Runs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range runs {
		ids = append(ids, r.RunID)
	}
	return strings.Join(ids, ",")
}

// TestAdminOnAFile: delete (finished only, unless --force), gc by age,
// compact, and usage errors, on a bbolt file.
func TestAdminOnAFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	s, err := kv.Open(path, kv.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	fill(t, s, 40)
	s.Close()

	if code, out := admin("delete", path, "f-0", "u"); code != exitProblem || !strings.Contains(out, "deleted f-0") || !strings.Contains(out, "not finished") {
		t.Fatalf("delete: %d\n%s", code, out)
	}
	if code, out := admin("delete", "--force", path, "u"); code != exitOK {
		t.Fatalf("delete --force: %d\n%s", code, out)
	}
	if code, out := admin("delete", path, "ghost"); code != exitProblem || !strings.Contains(out, `no run "ghost" in `) {
		t.Fatalf("delete of an unknown run: %d\n%s", code, out)
	}
	time.Sleep(10 * time.Millisecond)
	if code, out := admin("gc", "--finished-before", "5ms", path); code != exitOK || !strings.Contains(out, "deleted 39 finished runs") {
		t.Fatalf("gc: %d\n%s", code, out)
	}
	if ids := runIDs(t, path); ids != "" {
		t.Fatalf("left: %s", ids)
	}
	if code, out := admin("compact", path); code != exitOK || !strings.Contains(out, "compacted") {
		t.Fatalf("compact: %d\n%s", code, out)
	}
	for _, args := range [][]string{{}, {"frobnicate", path}, {"gc", path}, {"delete", path}, {"compact"},
		{"compact", "--force", path}, {"delete", "--finished-before", "1h", path, "u"}, {"gc", "--force", "--finished-before", "1h", path}} {
		if code, out := admin(args...); code != exitUsage {
			t.Errorf("%v: %d\n%s", args, code, out)
		}
	}
	// A mistyped path is refused, and no file is made there.
	typo := filepath.Join(t.TempDir(), "typo.db")
	for _, args := range [][]string{{"gc", "--finished-before", "1h", typo}, {"compact", typo}, {"delete", typo, "u"}} {
		if code, out := admin(args...); code != exitProblem || !strings.Contains(out, "no store at") {
			t.Errorf("%v: %d\n%s", args, code, out)
		}
		if _, err := os.Stat(typo); err == nil {
			t.Fatalf("%v made a store file at the mistyped path", args)
		}
	}
}

// TestAdminOnPostgres: delete and gc through a postgres:// URL; compact
// says what PostgreSQL does instead.
func TestAdminOnPostgres(t *testing.T) {
	url := pgtest.StoreURL(t)
	s, err := stores.Open(context.Background(), url, stores.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fill(t, s, 3)
	s.Close()
	if code, out := admin("delete", url, "f-0"); code != exitOK {
		t.Fatalf("delete: %d\n%s", code, out)
	}
	time.Sleep(10 * time.Millisecond)
	if code, out := admin("gc", "--finished-before", "5ms", url); code != exitOK || !strings.Contains(out, "deleted 2 finished runs") {
		t.Fatalf("gc: %d\n%s", code, out)
	}
	if ids := runIDs(t, url); ids != "u" {
		t.Fatalf("left: %s", ids)
	}
	if code, out := admin("compact", url); code != exitProblem || !strings.Contains(out, "VACUUM") {
		t.Fatalf("compact of a URL: %d\n%s", code, out)
	}
}

// TestHelpIsNotBadUsage: --help after a command prints the usage to
// stdout and exits 0, as polyloop-inspect does; a flag a command does not
// know is bad usage.
func TestHelpIsNotBadUsage(t *testing.T) {
	for _, args := range [][]string{{"gc", "--help"}, {"delete", "-h"}, {"cancel", "--help"}, {"resume", "-h"}} {
		var out, errOut strings.Builder
		if code := run(args, &out, &errOut); code != exitOK || !strings.Contains(out.String(), "Usage:") || errOut.Len() != 0 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out.String(), errOut.String())
		}
	}
	if code, out := admin("gc", "--finished-after", "1h", "x.db"); code != exitUsage || !strings.Contains(out, "finished-after") {
		t.Errorf("an unknown flag: %d\n%s", code, out)
	}
	for _, args := range [][]string{{"cancel", "x.db"}, {"resume", "x.db"}, {"resume", "--by", "ops", "x.db", "r"}, {"cancel", "--force", "x.db", "r"}} {
		if code, out := admin(args...); code != exitUsage {
			t.Errorf("%v: %d\n%s", args, code, out)
		}
	}
}

// TestAdminLeavesDamagedPostgresRunsAlone: a crashed run whose runs row
// was marked finished behind the store's back is neither deleted without
// --force nor by gc, which names it and exits 1; the finished runs go.
func TestAdminLeavesDamagedPostgresRunsAlone(t *testing.T) {
	url := pgtest.StoreURL(t)
	s, err := pgstore.Open(context.Background(), url, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fill(t, s, 2)
	conn, err := pgx.Connect(context.Background(), pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), `UPDATE `+pgx.Identifier{s.Schema(), "runs"}.Sanitize()+` SET status = 'finished' WHERE run_id = 'u'`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if code, out := admin("delete", url, "u"); code != exitProblem || !strings.Contains(out, `run "u" is damaged`) || !strings.Contains(out, "checksum") {
		t.Fatalf("delete of the damaged run: %d\n%s", code, out)
	}
	time.Sleep(10 * time.Millisecond)
	if code, out := admin("gc", "--finished-before", "5ms", url); code != exitProblem || !strings.Contains(out, "deleted 2 finished runs") ||
		!strings.Contains(out, `run "u" is damaged and was left alone`) {
		t.Fatalf("gc: %d\n%s", code, out)
	}
	if ids := runIDs(t, url); ids != "u" {
		t.Fatalf("left: %s", ids)
	}
}

// TestNoCommandShowsAPassword: delete, gc, compact, cancel, resume,
// approve, reject and resolve, given a PostgreSQL store in each form a
// connection string takes (a URL, a URL with its scheme in capitals, a
// keyword/value string) with a password — of a server that answers, or
// of one that cannot be reached — never print the password, and never
// take the string for a file.
func TestNoCommandShowsAPassword(t *testing.T) {
	password, forms := pgtest.StoreForms(t)
	const secret = "Pa55-w0rd"
	targets := append(forms,
		"postgres://agent:"+secret+"@127.0.0.1:1/db?sslmode=disable",
		"POSTGRES://agent:"+secret+"@127.0.0.1:1/db?sslmode=disable",
		"host=127.0.0.1 port=1 user=agent password='"+secret+"' sslmode=disable")
	dir := t.TempDir()
	t.Chdir(dir)
	for _, target := range targets {
		for _, args := range [][]string{
			{"delete", target, "missing"}, {"delete", "--force", target, "missing"},
			{"gc", "--finished-before", "1h", target}, {"compact", target},
			{"cancel", target, "missing"}, {"cancel", "--by", "ops", target, "missing"}, {"resume", target, "missing"},
			{"approve", target, "missing", "call"}, {"reject", "--note", "no", target, "missing", "call"},
			{"resolve", "--not-executed", target, "missing", "call"},
		} {
			code, all := admin(args...)
			for _, p := range []string{password, secret} {
				if strings.Contains(all, p) {
					t.Errorf("%q: exit %d, the password shows:\n%s", args, code, all)
				}
			}
		}
	}
	if made, _ := os.ReadDir(dir); len(made) > 0 {
		t.Errorf("a connection string was taken for a file: %s was created", made[0].Name())
	}
}
