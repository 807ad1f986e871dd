package events

import (
	"crypto/rand"
	"io"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
)

// IDSource mints ULIDs that strictly increase across all callers, even when
// many goroutines ask in the same millisecond or the clock steps back. Stores
// use it for event keys and the engine's driver for result ids. The zero
// value is ready to use and safe for concurrent use.
type IDSource struct {
	mu      sync.Mutex
	last    ulid.ULID
	entropy io.Reader
}

// Next returns a ULID greater than every one returned before, stamped with
// now's millisecond unless an earlier call was stamped later.
func (s *IDSource) Next(now time.Time) ulid.ULID {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.entropy == nil {
		s.entropy = rand.Reader
	}
	ms := ulid.Timestamp(now)
	if ms <= s.last.Time() && s.last != (ulid.ULID{}) {
		next := s.last
		if incremented(&next) {
			s.last = next
			return next
		}
		ms = s.last.Time() + 1 // entropy exhausted within one millisecond
	}
	// Minted in place: s.last's entropy is read into directly, where a
	// local's would move to the heap.
	if err := s.last.SetTime(ms); err != nil {
		panic(err) // only past year 10889
	}
	if _, err := io.ReadFull(s.entropy, s.last[6:]); err != nil {
		panic("events: crypto/rand failed: " + err.Error())
	}
	// Leave headroom so increments within this millisecond rarely overflow.
	s.last[6] &= 0x7f
	return s.last
}

// NextAfter returns an id from Next, or, when that is not after floor, the
// smallest id after floor. Stores pass a stream's last key as floor, so a
// stream's keys increase even when an earlier process wrote them with a
// clock ahead of this one: the new keys then carry floor's millisecond (or
// the next one) until the clock catches up. Unlike Next, the result is not
// ordered against this source's other results.
func (s *IDSource) NextAfter(now time.Time, floor ulid.ULID) ulid.ULID {
	id := s.Next(now)
	if id.Compare(floor) > 0 {
		return id
	}
	next := floor
	if incremented(&next) {
		return next
	}
	// floor's entropy is all ones: move to the next millisecond.
	next = ulid.ULID{}
	if err := next.SetTime(floor.Time() + 1); err != nil {
		panic(err) // only past year 10889
	}
	return next
}

// incremented adds one to the 80-bit entropy part; false on overflow.
func incremented(id *ulid.ULID) bool {
	for i := len(id) - 1; i >= 6; i-- {
		id[i]++
		if id[i] != 0 {
			return true
		}
	}
	return false
}
