package stores_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/kv/kvtest"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/stores"
)

// holdEnv names the bbolt file a child process of the test holds for
// writing (without serving readers) until its standard input closes.
const holdEnv = "STORES_TEST_HOLD"

// holdInChild holds path for writing in another process, without a
// reader socket, until t ends.
func holdInChild(t *testing.T, path string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), holdEnv+"="+path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "held\n" {
		t.Fatalf("the child did not hold %s: %q, %v", path, line, err)
	}
}

// hold is the child's side of holdInChild.
func hold(path string) {
	s, err := kv.Open(path, kv.Options{NoServe: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("held")
	bufio.NewReader(os.Stdin).ReadString('\n')
	s.Close()
	os.Exit(0)
}

// TestExplainSaysEachCauseOnceNamingTheStoreOnce: each way opening a
// store fails a person meets is one sentence naming the store once, as
// Describe names it, and the cause once, with no package prefix; the
// error it words stays matchable with errors.Is.
func TestExplainSaysEachCauseOnceNamingTheStoreOnce(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	u := kvtest.UnopenableStores(t, dir)
	missing, text, heldHere := u.Missing, u.NotAStore, u.Held
	long := filepath.Join(dir, strings.Repeat("d", 100))
	if err := os.Mkdir(long, 0o700); err != nil {
		t.Fatal(err)
	}
	heldLong := filepath.Join(long, "s.db")
	sl, err := kv.Open(heldLong, kv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sl.Close()
	heldThere := filepath.Join(dir, "there.db")
	holdInChild(t, heldThere)
	open := func(target string, readOnly bool) func() error {
		return func() error {
			_, err := stores.Open(ctx, target, stores.Options{ReadOnly: readOnly, LockTimeout: 50 * time.Millisecond, ConnectTimeout: 2 * time.Second})
			return err
		}
	}
	const noSocket = ", which does not answer readers on its socket (a writer opened with kv.Options.NoServe, or of a version without the socket)"
	cases := []struct {
		name   string
		target string
		err    func() error
		is     error
		want   string
	}{
		{"missing file, read", missing, open(missing, true), fs.ErrNotExist, "no store at " + missing + ": no such file or directory"},
		{"missing file, stat", missing, func() error { _, err := os.Stat(missing); return err }, fs.ErrNotExist, "no store at " + missing + ": no such file or directory"},
		{"not bbolt", text, open(text, true), kv.ErrNotAStore, text + " is not a PolyLoop store: not a bbolt file (no valid meta page)"},
		{"directory", dir, open(dir, false), kv.ErrNotAStore, dir + " is not a PolyLoop store: it is a directory"},
		{"held here, write", heldHere, open(heldHere, false), kv.ErrLocked, heldHere + " is held by this process (close that kv.Store first)"},
		{"held here, read", heldHere, open(heldHere, true), kv.ErrLocked, heldHere + " is held for writing by this process (close that kv.Store first)" + noSocket},
		{"held here, a socket path too long, read", heldLong, open(heldLong, true), kv.ErrLocked, heldLong + " is held for writing by this process (close that kv.Store first), which cannot answer readers: its socket's path is too long for a Unix socket (" +
			fmt.Sprint(len(heldLong+".sock")) + " bytes, limit 107; move the store to a shorter path)"},
		{"held elsewhere, write", heldThere, open(heldThere, false), kv.ErrLocked, heldThere + " is held by another process (waited 50ms)"},
		{"held elsewhere, read", heldThere, open(heldThere, true), kv.ErrLocked, heldThere + " is held for writing by another process (waited 50ms)" + noSocket},
		{"no server, URL", "postgres://u:pw@127.0.0.1:1/db", open("postgres://u:pw@127.0.0.1:1/db", true), nil,
			"cannot connect to postgres://u:xxxxx@127.0.0.1:1/db: connection refused"},
		{"no server, keywords", "host=127.0.0.1 port=1 user=u password=pw dbname=db", open("host=127.0.0.1 port=1 user=u password=pw dbname=db", false), nil,
			"cannot connect to host=127.0.0.1 port=1 user=u password=xxxxx dbname=db: connection refused"},
	}
	if url := pgtest.StoreURL(t); url != "" {
		schema := url[strings.LastIndex(url, "=")+1:]
		cases = append(cases, struct {
			name   string
			target string
			err    func() error
			is     error
			want   string
		}{"empty schema, read", url, open(url, true), pgstore.ErrSchemaVersion,
			fmt.Sprintf("%s: schema %q holds no PolyLoop store (version 0; this package reads version %d): open it read-write once to create it", stores.Describe(url), schema, pgstore.SchemaVersion)})
	}
	for _, c := range cases {
		err := c.err()
		if err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		got := stores.Explain(c.target, err)
		if got.Error() != c.want {
			t.Errorf("%s: %v\n   says %q\n   want %q", c.name, err, got, c.want)
		}
		if c.is != nil && !errors.Is(got, c.is) {
			t.Errorf("%s: the worded error is not %v", c.name, c.is)
		}
	}
	if stores.Explain("x.db", nil) != nil {
		t.Error("Explain of no error is an error")
	}
}
