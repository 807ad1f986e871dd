package stores_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/stores"
)

func TestMain(m *testing.M) {
	if path := os.Getenv(holdEnv); path != "" {
		hold(path)
	}
	os.Exit(pgtest.Main(m))
}

// TestOpenChoosesTheStoreByTarget: a path opens the bbolt store, a
// postgres:// URL the PostgreSQL one; ReadOnly reaches both.
func TestOpenChoosesTheStoreByTarget(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	s, err := stores.Open(ctx, path, stores.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.(*kv.Store); !ok {
		t.Fatalf("a path opened %T", s)
	}
	s.Close()
	ro, err := stores.Open(ctx, path, stores.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ro.Append(ctx, "r", [16]byte{}); err == nil {
		t.Fatal("a read-only file store appended")
	}
	ro.Close()

	url := pgtest.StoreURL(t)
	for _, readOnly := range []bool{false, true} {
		s, err := stores.Open(ctx, url, stores.Options{ReadOnly: readOnly})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := s.(*pgstore.Store); !ok {
			t.Fatalf("a URL opened %T", s)
		}
		s.Close()
	}
}

// TestTargetsNamePostgresInEveryFormPgxAccepts: a postgres:// or
// postgresql:// URL in any case, and a libpq keyword/value string, name a
// PostgreSQL database; anything else is a file path.
func TestTargetsNamePostgresInEveryFormPgxAccepts(t *testing.T) {
	for _, c := range []struct {
		target string
		want   bool
	}{
		{"postgres://h/db", true},
		{"postgresql://h/db", true},
		{"POSTGRES://agent:secret@h/db", true},
		{"PostgreSQL://h/db", true},
		{"host=db.internal password=secret dbname=agents", true},
		{"  dbname=agents", true},
		{"dbname = agents", true},
		{"password='a b' host=h", true},
		{"polyloop_schema=s host=h", true},
		{"host=h password='unterminated", true}, // malformed, but never a file: pgx says what is wrong
		{"x.db", false},
		{"/tmp/postgres", false},
		{"/tmp/run=1.db", false},
		{"./host=h", false}, // the way to name a file that looks like a keyword
		{"postgres:/h/db", false},
		{"postgres", false},
		{"", false},
	} {
		if got := stores.IsPostgres(c.target); got != c.want {
			t.Errorf("IsPostgres(%q) = %v, want %v", c.target, got, c.want)
		}
	}
}

// TestDescribeMasksEveryPassword: whatever form a connection string takes,
// every password in it (a URL's user password, encoded or not, a password
// or sslpassword query parameter or keyword, quoted or not) is shown as
// xxxxx, and what cannot be told apart from a password is withheld; the
// rest is shown as written, so a reader knows which database is meant. A
// path is described as an absolute path.
func TestDescribeMasksEveryPassword(t *testing.T) {
	for _, c := range []struct{ target, want string }{
		{"postgres://agent:s3cret@db.internal:5432/agents?sslmode=require", "postgres://agent:xxxxx@db.internal:5432/agents?sslmode=require"},
		{"POSTGRES://agent:s3cret@db/agents", "postgres://agent:xxxxx@db/agents"},
		{"PostgreSQL://agent:s3cret@db/agents", "postgresql://agent:xxxxx@db/agents"},
		{"postgres://agent:p%40ss%2Fw%3Ard%20x@db/agents", "postgres://agent:xxxxx@db/agents"},
		{"postgres://agent:p@ss@db/agents", "postgres://agent:xxxxx@db/agents"},
		{"postgres://agent:pa/ss@db/agents", "postgres://agent:xxxxx@db/agents"},
		{"postgres://agent:pa?ss@db/agents", "postgres://agent:xxxxx@db/agents"},
		{"postgres://agent:pa:s:s@db/agents", "postgres://agent:xxxxx@db/agents"},
		{"postgres://agent:pa/s?s@db/agents", "postgres://agent:xxxxx@db/agents"},
		{"postgres://agent:s3cret@h1:5432,h2:5433/agents", "postgres://agent:xxxxx@h1:5432,h2:5433/agents"},
		{"postgres://agent:s3cret@[::1]:5432/agents", "postgres://agent:xxxxx@[::1]:5432/agents"},
		{"postgres://agent@db/agents?password=s3cret&sslpassword=k3y", "postgres://agent@db/agents?password=xxxxx&sslpassword=xxxxx"},
		{"postgres://agent@db/agents?sslmode=disable&pass%77ord=s3cret", "postgres://agent@db/agents?sslmode=disable&pass%77ord=xxxxx"},
		{"postgres://agent@db/agents?PASSWORD=s3cret", "postgres://agent@db/agents?PASSWORD=xxxxx"},
		{"postgres://agent@db/agents?password=s3&cret&sslmode=disable", "postgres://agent@db/agents?password=xxxxx&…"},
		{"postgres://agent:s3cret@db/agents?application_name=me@host", "postgres://agent:xxxxx@db/agents?application_name=me@host"},
		{"postgres:///agents?host=/tmp&password=s3cret", "postgres:///agents?host=/tmp&password=xxxxx"},
		{"postgres:///agents?password=s3cret&application_name=me:1@host", "postgres://xxxxx@host"},
		{"postgres://db/agents", "postgres://db/agents"},
		{"postgres://agent@db/agents", "postgres://agent@db/agents"},
		{"host=db password=s3cret dbname=agents", "host=db password=xxxxx dbname=agents"},
		{"host=db password='s3 cr\\'et' dbname=agents", "host=db password=xxxxx dbname=agents"},
		{"host=db password = s3cret", "host=db password = xxxxx"},
		{"host=db password=s3\\ cret dbname=agents", "host=db password=xxxxx dbname=agents"},
		{"host=db sslpassword=k3y PASSWORD=s3cret", "host=db sslpassword=xxxxx PASSWORD=xxxxx"},
		{"host=db password='s3 cret", "host=db password=xxxxx"},
		{"host='db password=s3cret", "host=…"},
		{"host=db s3cret", "host=db …"},
		{"host=db password=", "host=db password="},
	} {
		if got := stores.Describe(c.target); got != c.want {
			t.Errorf("Describe(%q)\n = %q\nwant %q", c.target, got, c.want)
		}
	}
	if got := stores.Describe("x.db"); !filepath.IsAbs(got) {
		t.Errorf("Describe(path) = %q", got)
	}
}

// TestOpenTakesEveryFormOfConnectionString: the URL, the URL with its
// scheme in capitals and the keyword/value string of one store all open
// it.
func TestOpenTakesEveryFormOfConnectionString(t *testing.T) {
	ctx := context.Background()
	_, forms := pgtest.StoreForms(t)
	for i, target := range forms {
		s, err := stores.Open(ctx, target, stores.Options{})
		if err != nil {
			t.Fatalf("form %d: %v", i, err)
		}
		if i == 0 {
			proptest.AppendEach(t, s, "r", proptest.SoundStream("r")[:2])
		}
		runs, err := s.Runs(ctx)
		s.Close()
		if err != nil || len(runs) != 1 || runs[0].RunID != "r" {
			t.Fatalf("form %d lists %+v, %v: not the store the others name", i, runs, err)
		}
	}
}

// TestOpenErrorsNeverShowAPassword: whatever goes wrong — a server that
// cannot be reached, a string that does not parse, a URL whose password
// holds an unencoded delimiter — the error names the target without any
// part of its password, and no file is created in its name.
func TestOpenErrorsNeverShowAPassword(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	for _, c := range []struct {
		target string
		says   string // the error must say this
	}{
		{"postgres://agent:Pa55-w0rd@127.0.0.1:1/db?sslmode=disable", "127.0.0.1"},
		{"POSTGRES://agent:Pa55-w0rd@127.0.0.1:1/db?sslmode=disable", "127.0.0.1"},
		{"postgres://agent:Pa55%2Fw0rd%40x@127.0.0.1:1/db?sslmode=disable", "127.0.0.1"},
		{"postgres://agent@127.0.0.1:1/db?password=Pa55-w0rd&sslmode=disable", "127.0.0.1"},
		{"host=127.0.0.1 port=1 user=agent password=Pa55-w0rd dbname=db sslmode=disable", "127.0.0.1"},
		{"host=127.0.0.1 port=1 password='Pa55 w0rd' sslmode=disable", "127.0.0.1"},
		{"host=127.0.0.1 port=1 password=Pa55\\ w0rd sslmode=disable", "127.0.0.1"},
		{"host=127.0.0.1 port=1 password='Pa55 w0rd", "no closing quote"},
		{"host=127.0.0.1 password=Pa55 w0rd dbname=db", "must be quoted"},
		{"host=127.0.0.1 port=x password=Pa55-w0rd", "invalid port"},
		{"postgres://agent@127.0.0.1:1/db?password=Pa55&w0rd", "does not parse"},
		{"postgres://agent:Pa55@w0rd@127.0.0.1:1/db", "percent-encode"},
		{"postgres://agent:Pa55/w0rd@127.0.0.1:1/db", "percent-encode"},
	} {
		_, err := stores.Open(context.Background(), c.target, stores.Options{ConnectTimeout: 2 * time.Second})
		if err == nil {
			t.Errorf("%s: opened", c.target)
			continue
		}
		for _, part := range []string{"Pa55", "w0rd"} {
			if strings.Contains(err.Error(), part) {
				t.Errorf("%s: the error shows the password (%q): %v", c.target, part, err)
			}
		}
		if !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: the error does not say %q: %v", c.target, c.says, err)
		}
	}
	if made, _ := os.ReadDir(dir); len(made) > 0 {
		t.Errorf("a connection string was taken for a file: %s was created", made[0].Name())
	}
}
