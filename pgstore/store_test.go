package pgstore_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
)

// ExampleOpen needs a server: where the tests skip for want of one, Main
// leaves it out of the run.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, "ExampleOpen")) }

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

// TestRunLeaseContract: the stores of a fleet are several processes' views
// of one schema, each with its own pool and owner.
func TestRunLeaseContract(t *testing.T) {
	proptest.RunLeaseContract(t, func(t *testing.T, n int, term time.Duration) ([]seams.RunStore, func(int)) {
		first := open(t, pgstore.Options{LeaseDuration: term})
		fleet := []*pgstore.Store{first}
		for range n - 1 {
			fleet = append(fleet, open(t, pgstore.Options{Schema: first.Schema(), LeaseDuration: term}))
		}
		out := make([]seams.RunStore, n)
		for i, s := range fleet {
			out[i] = s
		}
		return out, func(i int) { pgstore.StopRenewing(fleet[i]) }
	})
}

// TestRunQueueContract: the second store is another process's view of the
// schema, with its own owner.
func TestRunQueueContract(t *testing.T) {
	proptest.RunQueueContract(t, func(t *testing.T) proptest.QueueStore { return open(t, pgstore.Options{}) },
		func(t *testing.T, s proptest.QueueStore) proptest.QueueStore {
			return open(t, pgstore.Options{Schema: s.(*pgstore.Store).Schema()})
		})
}

func TestRunForkerContract(t *testing.T) {
	proptest.RunForkerContract(t, func(t *testing.T) proptest.ForkStore { return open(t, pgstore.Options{}) }, pgstore.StoredValues)
}
