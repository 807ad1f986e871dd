package stores_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/stores"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

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

// TestDescribeNeverShowsAPassword: a URL is described without its
// password, a path as an absolute path.
func TestDescribeNeverShowsAPassword(t *testing.T) {
	got := stores.Describe("postgres://agent:s3cret@db.internal:5432/agents?sslmode=require")
	if strings.Contains(got, "s3cret") || !strings.Contains(got, "db.internal") {
		t.Errorf("Describe = %q", got)
	}
	if got := stores.Describe("postgres://agent@db/agents?password=s3cret&sslpassword=k3y"); strings.Contains(got, "s3cret") || strings.Contains(got, "k3y") {
		t.Errorf("Describe = %q", got)
	}
	if got := stores.Describe("x.db"); !filepath.IsAbs(got) {
		t.Errorf("Describe(path) = %q", got)
	}
	for target, want := range map[string]bool{"postgres://h/db": true, "postgresql://h/db": true, "x.db": false, "/tmp/postgres": false} {
		if stores.IsURL(target) != want {
			t.Errorf("IsURL(%q) = %v", target, !want)
		}
	}
}
