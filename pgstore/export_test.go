package pgstore

import "time"

// SetClock replaces s's clock (tests step it back).
func SetClock(s *Store, now func() time.Time) { s.clock = now }

// PoolSize is the most connections s's pool opens.
func PoolSize(s *Store) int32 { return s.pool.Config().MaxConns }
