package pgstore

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
)

// SetClock replaces s's clock (tests step it back).
func SetClock(s *Store, now func() time.Time) { s.clock = now }

// PoolSize is the most connections s's pool opens.
func PoolSize(s *Store) int32 { return s.pool.Config().MaxConns }

// StopRenewing stops s renewing its leases, as if its process hung: they
// expire after their term.
func StopRenewing(s *Store) {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	s.noRenew = true
}

// Queued is how many appends wait for a sender.
func Queued(s *Store) int {
	s.group.mu.Lock()
	defer s.group.mu.Unlock()
	return len(s.group.queue)
}

// ClaimSQL is s's claim statement: $1 the agents, $2 the most runs, $3 the
// owner, $4 the lease term in microseconds.
func ClaimSQL(s *Store) string { return s.q.claim }

// LetGo marks s's hold of runID as one it is letting go of — what a
// release does before it gives the lease back on the server — without
// forgetting it: the moment between the two.
func LetGo(s *Store, runID string) {
	l := s.leaseOf(runID)
	l.mu.Lock()
	l.lost = fmt.Errorf("run %q: %w: letting go (test)", runID, seams.ErrRunLocked)
	l.mu.Unlock()
}

// StoredValues is the values s stores for run's events, in order.
func StoredValues(t *testing.T, fs proptest.ForkStore, run string) [][]byte {
	t.Helper()
	s := fs.(*Store)
	rows, err := s.pool.Query(context.Background(), s.q.prefix, run, int64(math.MaxInt64))
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for rows.Next() {
		var (
			seq   int64
			id, v []byte
		)
		if err := rows.Scan(&seq, &id, &v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
