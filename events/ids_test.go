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

// TestNextAfterStaysAfterAFloorFromTheFuture: a stream written with a clock
// an hour ahead still gets increasing keys from a process whose clock is
// behind it, including when the floor's entropy is exhausted.
func TestNextAfterStaysAfterAFloorFromTheFuture(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	var src events.IDSource
	floor := src.Next(now.Add(time.Hour))
	maxed := floor
	for i := 6; i < len(maxed); i++ {
		maxed[i] = 0xff
	}
	carry := floor // the last byte about to carry into the one before it
	carry[15] = 0xff
	for _, f := range []ulid.ULID{floor, carry, maxed, {}} {
		last := f
		for range 100 {
			id := src.NextAfter(now, last)
			if id.Compare(last) <= 0 {
				t.Fatalf("NextAfter(%s) = %s, not after the floor", last, id)
			}
			last = id
		}
	}
	if id := src.NextAfter(now.Add(2*time.Hour), floor); id.Time() != ulid.Timestamp(now.Add(2*time.Hour)) {
		t.Fatalf("with the clock past the floor, NextAfter = %s, want the clock's millisecond", id)
	}
}

// TestSourcesMintRandomIDs: two sources minting in the same millisecond
// (two processes, or two drivers' result ids) do not collide: an id's
// entropy is random, not a counter from zero.
func TestSourcesMintRandomIDs(t *testing.T) {
	now := time.Now()
	var a, b events.IDSource
	x, y := a.Next(now), b.Next(now)
	if x == y {
		t.Fatalf("two sources minted %s in the same millisecond", x)
	}
}
