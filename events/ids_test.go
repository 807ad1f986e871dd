package events_test

import (
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
)

// TestIDSourceIsMonotonicUnderContention: keys order events even when many
// goroutines mint in the same millisecond and the clock steps back.
func TestIDSourceIsMonotonicUnderContention(t *testing.T) {
	var src events.IDSource
	now := time.UnixMilli(1_700_000_000_000)
	const workers, each = 16, 500
	out := make([][]ulid.ULID, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				at := now
				if i%7 == 0 {
					at = now.Add(-time.Second) // clock stepped back
				}
				out[w] = append(out[w], src.Next(at))
			}
		}()
	}
	wg.Wait()
	seen := map[ulid.ULID]bool{}
	for _, ids := range out {
		for i, id := range ids {
			if seen[id] {
				t.Fatalf("duplicate id %s", id)
			}
			seen[id] = true
			if i > 0 && id.Compare(ids[i-1]) <= 0 {
				t.Fatalf("ids not increasing within one goroutine: %s after %s", id, ids[i-1])
			}
		}
	}
}
