package pgstore_test

import (
	"context"
	"os"
	"testing"

	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// open opens a store in a schema of its own on the test server, closed
// and dropped when t ends.
func open(t testing.TB, o pgstore.Options) *pgstore.Store {
	t.Helper()
	dsn := pgtest.DSN(t)
	if o.Schema == "" {
		o.Schema = pgtest.Schema(t)
	}
	s, err := pgstore.Open(context.Background(), dsn, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestRunStoreContract(t *testing.T) {
	proptest.RunStoreContract(t, func(t *testing.T) seams.RunStore { return open(t, pgstore.Options{}) })
}

func TestRunDeleterContract(t *testing.T) {
	proptest.RunDeleterContract(t, func(t *testing.T) proptest.DeletingStore { return open(t, pgstore.Options{}) })
}
