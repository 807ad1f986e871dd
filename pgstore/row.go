package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// rowColumns are a runs row's columns in the order rowScan takes them,
// each prefixed with p (a table alias and a dot, or nothing).
func rowColumns(p string) string {
	cols := []string{"run_id", "status", "steps", "events", "stop_reason", "first_event", "last_event", "last_id", "crc"}
	return p + strings.Join(cols, ", "+p)
}

// indexRow is a runs row: the run's index entry and the checksum stored
// beside it.
type indexRow struct {
	info seams.RunInfo
	crc  uint32
}

// rowSum is the checksum a runs row holding info must carry: the entry's
// seams.RunInfo.Checksum (without a key: the run id is a column) over its
// values as the columns keep them, times to the microsecond.
func rowSum(info seams.RunInfo) uint32 {
	info.FirstEvent = info.FirstEvent.Truncate(time.Microsecond)
	info.LastEvent = info.LastEvent.Truncate(time.Microsecond)
	return info.Checksum(nil)
}

// newRow is the row holding info, with its checksum.
func newRow(info seams.RunInfo) indexRow { return indexRow{info: info, crc: rowSum(info)} }

// rowScan receives a runs row's columns (rowColumns), every one NULL when
// a query's outer join found no row.
type rowScan struct {
	runID, status, stop *string
	steps, count        *int64
	first, last         *time.Time
	lastID              []byte
	crc                 *int64
}

func (r *rowScan) dest() []any {
	return []any{&r.runID, &r.status, &r.steps, &r.count, &r.stop, &r.first, &r.last, &r.lastID, &r.crc}
}

// info is the entry the row's columns hold, every one but crc non-null
// (a last_id that is not 16 bytes is left zero).
func (r *rowScan) info() seams.RunInfo {
	info := seams.RunInfo{RunID: *r.runID, Status: seams.RunStatus(*r.status), Steps: int(*r.steps), Events: int(*r.count),
		StopReason: events.StopReason(*r.stop), FirstEvent: *r.first, LastEvent: *r.last}
	if len(r.lastID) == 16 {
		info.LastID = ulid.ULID(r.lastID)
	}
	return info
}

// row is the row scanned: ok false when there was none, and an error
// naming the run and the mismatch (not yet wrapping ErrCorrupt) when its
// values break the index's rules or do not sum to its checksum. A row in
// error is never to be trusted, only reported: its info is then what its
// columns hold when they are complete (for naming what differs), else
// zero.
func (r *rowScan) row() (row indexRow, ok bool, err error) {
	if r.runID == nil {
		return indexRow{}, false, nil
	}
	id := *r.runID
	if r.status == nil || r.stop == nil || r.steps == nil || r.count == nil || r.first == nil || r.last == nil {
		return indexRow{}, true, fmt.Errorf("index row of run %q has empty columns", id)
	}
	if len(r.lastID) != 16 {
		return indexRow{}, true, fmt.Errorf("index row of run %q: its last_id is %d bytes, not a ULID", id, len(r.lastID))
	}
	info := r.info()
	switch {
	case r.crc == nil:
		return indexRow{info: info}, true, fmt.Errorf("index row of run %q has no checksum", id)
	case *r.crc < 0 || *r.crc > 1<<32-1:
		return indexRow{info: info}, true, fmt.Errorf("index row of run %q: its crc column holds %d, not a CRC-32C", id, *r.crc)
	}
	if sum := rowSum(info); uint32(*r.crc) != sum {
		return indexRow{info: info}, true, fmt.Errorf("index row of run %q fails its checksum: its crc column holds %d, its columns sum to %d (%s, %d steps, %d events, stop reason %q, first event %s, last event %s, last key %s)",
			id, *r.crc, sum, info.Status, info.Steps, info.Events, info.StopReason,
			info.FirstEvent.UTC().Format(time.RFC3339Nano), info.LastEvent.UTC().Format(time.RFC3339Nano), info.LastID)
	}
	return indexRow{info: info, crc: uint32(*r.crc)}, true, nil
}

// session runs statements: the pool, or a transaction.
type session interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// readRow reads runID's runs row through q: ok false when there is none;
// an error wrapping ErrCorrupt when it is damaged.
func (s *Store) readRow(ctx context.Context, q session, runID string) (indexRow, bool, error) {
	var sc rowScan
	_, err := retry(ctx, func() (struct{}, error) {
		return struct{}{}, q.QueryRow(ctx, s.q.row, runID).Scan(sc.dest()...)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return indexRow{}, false, nil
	case err != nil:
		return indexRow{}, false, fmt.Errorf("pgstore: read the index row of run %q: %w", runID, err)
	}
	row, ok, err := sc.row()
	if err != nil {
		return indexRow{}, true, fmt.Errorf("pgstore: %w: %w", ErrCorrupt, err)
	}
	return row, ok, nil
}

// disagreements are the ways row differs from the summary of its stream
// (seams.RunInfo.Apply over every event), beyond the length and last
// key Load compares anyway: none for a row the store wrote. The stream is
// the truth; a row that disagrees is damage even when it sums to its
// checksum (a row edited with its checksum, or before the store kept one).
func disagreements(row, stream seams.RunInfo) []error {
	var out []error
	differ := func(what string, r, s any) {
		out = append(out, fmt.Errorf("index row of run %q says %s %v, its stream %v", row.RunID, what, r, s))
	}
	if row.Status != stream.Status {
		differ("status", row.Status, stream.Status)
	}
	if row.Steps != stream.Steps {
		differ("step count", row.Steps, stream.Steps)
	}
	if row.StopReason != stream.StopReason {
		differ("stop reason", fmt.Sprintf("%q", row.StopReason), fmt.Sprintf("%q", stream.StopReason))
	}
	stamp := func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
	if !row.FirstEvent.Equal(stream.FirstEvent) {
		differ("first event time", stamp(row.FirstEvent), stamp(stream.FirstEvent))
	}
	if !row.LastEvent.Equal(stream.LastEvent) {
		differ("last event time", stamp(row.LastEvent), stamp(stream.LastEvent))
	}
	return out
}
