package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/retention"
)

// adminOut runs the command and returns its exit status, stdout and
// stderr apart.
func adminOut(args ...string) (int, string, string) {
	var out, errOut strings.Builder
	code := run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// fileStore is a bbolt file holding the finished runs f-0…f-(n-1) and the
// unfinished run "u".
func fileStore(t *testing.T, n int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.db")
	s, err := kv.Open(path, kv.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	fill(t, s, n)
	s.Close()
	return path
}

// chained reports the package chains and doubled words a message to a
// person should not carry.
func chained(s string) []string {
	var bad []string
	for _, p := range []string{"kv: ", "pgstore: ", "seams: ", "retention: ", "engine: ", "stores: ", "by another driver by", "run \"u\": run \"u\""} {
		if strings.Contains(s, p) {
			bad = append(bad, p)
		}
	}
	return bad
}

// TestDeleteRefusalsAreSaidOnce: delete's refusals of a run not in the
// store and of an unfinished run are one sentence each, naming the run,
// without the stores' package chain.
func TestDeleteRefusalsAreSaidOnce(t *testing.T) {
	path := fileStore(t, 1)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"delete", path, "nope"}, `polyloop-admin: delete: no run "nope" in ` + path + "\n"},
		{[]string{"delete", path, "u"}, `polyloop-admin: delete: run "u" is not finished (it may be resumed); --force deletes it` + "\n"},
		{[]string{"delete", "--dry-run", path, "nope"}, `polyloop-admin: delete: no run "nope" in ` + path + "\n"},
		{[]string{"delete", "--dry-run", path, "u"}, `polyloop-admin: delete: run "u" is not finished (it may be resumed); --force deletes it` + "\n"},
	} {
		code, out, errOut := adminOut(c.args...)
		if code != exitProblem || out != "" || errOut != c.want {
			t.Errorf("%q: exit %d\nstdout: %q\nstderr: %q\nwant stderr %q", c.args, code, out, errOut, c.want)
		}
	}
}

// TestDeleteOfAHeldRunNamesItsHolderOnce: on PostgreSQL, delete --force
// of a run another worker holds says who holds it, once, and deletes
// nothing; so does --dry-run. (A finished run is held only while a Resume
// returns its result, and PostgreSQL lists no holder for it: its refusal
// says "held by a driver" alone.)
func TestDeleteOfAHeldRunNamesItsHolderOnce(t *testing.T) {
	url := heldRun(t, "u")
	for _, args := range [][]string{{"delete", "--force", url, "u"}, {"delete", "--force", "--dry-run", url, "u"}} {
		code, out, errOut := adminOut(args...)
		want := `polyloop-admin: delete: run "u" is held by a driver (worker-7`
		if code != exitProblem || out != "" || !strings.HasPrefix(errOut, want) || chained(errOut) != nil {
			t.Errorf("%q: exit %d\nstdout: %q\nstderr: %q\nwant stderr starting %q, without %q", args[:len(args)-2], code, out, errOut, want, chained(errOut))
		}
	}
	if ids := runIDs(t, url); ids != "f-0,u" {
		t.Fatalf("left: %s", ids)
	}
}

// TestDryRunWritesNothing: delete --dry-run and gc --dry-run say what
// they would delete, and the file is byte for byte what it was.
func TestDryRunWritesNothing(t *testing.T) {
	path := fileStore(t, 3)
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"delete", "--dry-run", path, "f-0", "f-1"}, "would delete f-0\nwould delete f-1\n"},
		{[]string{"delete", "--dry-run", "--force", path, "u"}, "would delete u\n"},
		{[]string{"gc", "--dry-run", "--finished-before", "5ms", path}, "would delete f-0\nwould delete f-1\nwould delete f-2\nwould delete 3 finished runs older than 5ms\n"},
	} {
		code, out, errOut := adminOut(c.args...)
		if code != exitOK || out != c.want || errOut != "" {
			t.Errorf("%q: exit %d\nstdout: %q\nstderr: %q\nwant stdout %q", c.args, code, out, errOut, c.want)
		}
	}
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Fatal("a dry run changed the store file")
	}
	if ids := runIDs(t, path); ids != "f-0,f-1,f-2,u" {
		t.Fatalf("left: %s", ids)
	}
}

// TestGCListsTheRunsItDeleted: gc names each run it deleted, then the
// count.
func TestGCListsTheRunsItDeleted(t *testing.T) {
	path := fileStore(t, 2)
	time.Sleep(10 * time.Millisecond)
	code, out, errOut := adminOut("gc", "--finished-before", "5ms", path)
	if want := "deleted f-0\ndeleted f-1\ndeleted 2 finished runs older than 5ms\n"; code != exitOK || out != want || errOut != "" {
		t.Fatalf("exit %d\nstdout: %q\nstderr: %q\nwant stdout %q", code, out, errOut, want)
	}
}

// TestJSONSaysPerRunWhatWasDone: with --json, delete and gc print one
// object per run — its id, what was done or would be done, and why a run
// was skipped — and nothing else on stdout; the exit status is the text
// mode's.
func TestJSONSaysPerRunWhatWasDone(t *testing.T) {
	path := fileStore(t, 2)
	time.Sleep(10 * time.Millisecond)
	for _, c := range []struct {
		args []string
		code int
		want []outcome
	}{
		{[]string{"delete", "--json", "--dry-run", path, "f-0", "u", "nope"}, exitProblem, []outcome{
			{Run: "f-0", Action: "would_delete"},
			{Run: "u", Action: "skipped", Reason: "not finished (it may be resumed); --force deletes it"},
			{Run: "nope", Action: "skipped", Reason: "no such run"}}},
		{[]string{"gc", "--json", "--dry-run", "--finished-before", "5ms", path}, exitOK, []outcome{
			{Run: "f-0", Action: "would_delete"}, {Run: "f-1", Action: "would_delete"}}},
		{[]string{"delete", "--json", path, "f-0", "u"}, exitProblem, []outcome{
			{Run: "f-0", Action: "deleted"},
			{Run: "u", Action: "skipped", Reason: "not finished (it may be resumed); --force deletes it"}}},
		{[]string{"gc", "--json", "--finished-before", "5ms", path}, exitOK, []outcome{{Run: "f-1", Action: "deleted"}}},
	} {
		code, out, errOut := adminOut(c.args...)
		var got []outcome
		dec := json.NewDecoder(strings.NewReader(out))
		dec.DisallowUnknownFields()
		for dec.More() {
			var o outcome
			if err := dec.Decode(&o); err != nil {
				t.Fatalf("%q: %v in stdout %q", c.args, err, out)
			}
			got = append(got, o)
		}
		wantJSON, _ := json.Marshal(c.want)
		gotJSON, _ := json.Marshal(got)
		if code != c.code || string(gotJSON) != string(wantJSON) || errOut != "" {
			t.Errorf("%q: exit %d, want %d\nstdout: %s\nwant:   %s\nstderr: %q", c.args, code, c.code, gotJSON, wantJSON, errOut)
		}
	}
}

// TestDryRunOpensTheStoreReadOnly: a dry run reads, so it opens the store
// for reading only. An empty PostgreSQL schema is not migrated by it (no
// table is created; the dry run says there is no store there), and a
// bbolt file of an older format (one without the queue bucket, which a
// read-write open adds) is byte for byte what it was after delete and gc
// --dry-run, which still say what they would delete.
func TestDryRunOpensTheStoreReadOnly(t *testing.T) {
	t.Run("postgres", func(t *testing.T) {
		url := pgtest.StoreURL(t)
		schema := url[strings.LastIndex(url, "=")+1:]
		for _, args := range [][]string{
			{"gc", "--dry-run", "--finished-before", "1h", url},
			{"delete", "--dry-run", url, "r"},
		} {
			code, out, errOut := adminOut(args...)
			if code != exitProblem || out != "" || !strings.Contains(errOut, "holds no PolyLoop store") {
				t.Errorf("%q on an empty schema: exit %d\nstdout: %q\nstderr: %q", args[:len(args)-1], code, out, errOut)
			}
		}
		conn, err := pgx.Connect(context.Background(), pgtest.DSN(t))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		var tables int
		if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM information_schema.tables WHERE table_schema = $1`, schema).Scan(&tables); err != nil {
			t.Fatal(err)
		}
		if tables != 0 {
			t.Fatalf("a dry run created %d tables in schema %s", tables, schema)
		}
	})
	t.Run("old kv format", func(t *testing.T) {
		path := fileStore(t, 2)
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket([]byte("queue")) }); err != nil {
			t.Fatal(err)
		}
		db.Close()
		before, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"delete", "--dry-run", path, "f-0"}, "would delete f-0\n"},
			{[]string{"gc", "--dry-run", "--finished-before", "5ms", path}, "would delete f-0\nwould delete f-1\nwould delete 2 finished runs older than 5ms\n"},
		} {
			code, out, errOut := adminOut(c.args...)
			if code != exitOK || out != c.want || errOut != "" {
				t.Errorf("%q: exit %d\nstdout: %q\nstderr: %q\nwant stdout %q", c.args, code, out, errOut, c.want)
			}
		}
		after, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(before, after) {
			t.Fatal("a dry run changed a file of the older format (it was opened read-write)")
		}
	})
}

// TestGCNamesEachHeldRunItLeavesAlone: gc without --json names on stderr
// each run it leaves alone because a driver holds it, and why, as the
// help promises, besides counting them; --json says it as an object.
func TestGCNamesEachHeldRunItLeavesAlone(t *testing.T) {
	url := heldRun(t, "f-0")
	time.Sleep(10 * time.Millisecond)
	code, out, errOut := adminOut("gc", "--finished-before", "5ms", url)
	wantOut := "deleted 0 finished runs older than 5ms; 1 held by a driver, left for the next pass\n"
	wantErr := `polyloop-admin: gc: run "f-0" is held by a driver; left for the next pass` + "\n"
	if code != exitOK || out != wantOut || errOut != wantErr {
		t.Errorf("exit %d\nstdout: %q\nstderr: %q\nwant stdout %q\n     stderr %q", code, out, errOut, wantOut, wantErr)
	}
	code, out, errOut = adminOut("gc", "--json", "--finished-before", "5ms", url)
	if want := `{"run_id":"f-0","action":"skipped","reason":"held by a driver; left for the next pass"}` + "\n"; code != exitOK || out != want || errOut != "" {
		t.Errorf("--json: exit %d\nstdout: %q\nstderr: %q\nwant stdout %q", code, out, errOut, want)
	}
}

// failingDeleter is a store whose DeleteRun fails with an error that is
// no refusal (a disk or a connection that fails).
type failingDeleter struct{ retention.Store }

var errDiskFailed = errors.New("write /var/lib/runs.db: input/output error")

func (failingDeleter) DeleteRun(context.Context, string, bool) error { return errDiskFailed }

// TestJSONSaysAFailedDeleteAsAnObject: with --json, a run whose deletion
// fails for a reason that is no refusal still gets its object on stdout —
// action "error" and the error — and nothing goes to stderr; without
// --json the error is said on stderr. Either way the exit status is 1.
func TestJSONSaysAFailedDeleteAsAnObject(t *testing.T) {
	s, err := kv.Open(fileStore(t, 1), kv.Options{NoSync: true, NoServe: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	w := failingDeleter{s}
	var out, errOut strings.Builder
	code := deleteRuns(context.Background(), s, w, newOutcomes("delete", "s.db", true, &out, &errOut), []string{"f-0"}, false)
	want := `{"run_id":"f-0","action":"error","reason":"write /var/lib/runs.db: input/output error"}` + "\n"
	if code != exitProblem || out.String() != want || errOut.String() != "" {
		t.Errorf("--json: exit %d\nstdout: %q\nstderr: %q\nwant stdout %q", code, out.String(), errOut.String(), want)
	}
	out.Reset()
	errOut.Reset()
	code = deleteRuns(context.Background(), s, w, newOutcomes("delete", "s.db", false, &out, &errOut), []string{"f-0"}, false)
	if want := "polyloop-admin: write /var/lib/runs.db: input/output error\n"; code != exitProblem || out.String() != "" || errOut.String() != want {
		t.Errorf("text: exit %d\nstdout: %q\nstderr: %q\nwant stderr %q", code, out.String(), errOut.String(), want)
	}
}

// heldRun is a PostgreSQL store holding fill's runs, one of which, run,
// a driver named worker-7 holds until the test ends; it returns the
// store's URL.
func heldRun(t *testing.T, run string) string {
	t.Helper()
	url := pgtest.StoreURL(t)
	s, err := pgstore.Open(context.Background(), url, pgstore.Options{Owner: "worker-7"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	fill(t, s, 1)
	release, err := s.LockRun(run)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	return url
}
