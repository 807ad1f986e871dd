package pgstore

import "time"

// SetClock replaces s's clock (tests step it back).
func SetClock(s *Store, now func() time.Time) { s.clock = now }
