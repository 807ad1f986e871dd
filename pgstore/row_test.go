package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/pgstore/pgtest"
	"github.com/polyloop/polyloop/projections"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/retention"
	"github.com/polyloop/polyloop/seams"
)

// crashed writes run d as a crash leaves it: two steps done, no
// run_finished (8 events).
func crashed(t *testing.T, s *pgstore.Store) {
	t.Helper()
	proptest.AppendEach(t, s, "d", proptest.SoundStream("d")[:8])
}

// TestAnEditedIndexRowIsDamage: a runs row changed behind the store's
// back is damage wherever the row decides anything. Load (so verify)
// reports it as ErrCorrupt naming the run and its index row, Runs lists
// the run damaged, DeleteRun without force and retention leave it alone,
// an append continuing it is refused; only a forced delete removes it.
func TestAnEditedIndexRowIsDamage(t *testing.T) {
	cases := []struct{ name, sql string }{
		{"a crashed run marked finished", `UPDATE {{schema}}.runs SET status = 'finished', stop_reason = 'agent_finished' WHERE run_id = 'd'`},
		{"status alone", `UPDATE {{schema}}.runs SET status = 'finished' WHERE run_id = 'd'`},
		{"steps", `UPDATE {{schema}}.runs SET steps = steps + 3 WHERE run_id = 'd'`},
		{"stop reason", `UPDATE {{schema}}.runs SET stop_reason = 'step_budget' WHERE run_id = 'd'`},
		{"first event", `UPDATE {{schema}}.runs SET first_event = first_event - interval '1 day' WHERE run_id = 'd'`},
		{"last event", `UPDATE {{schema}}.runs SET last_event = last_event - interval '1 day' WHERE run_id = 'd'`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			s := open(t, pgstore.Options{})
			crashed(t, s)
			before, err := s.Load(ctx, "d")
			if err != nil {
				t.Fatal(err)
			}
			exec(t, s.Schema(), c.sql)

			got, err := s.Load(ctx, "d")
			if !errors.Is(err, pgstore.ErrCorrupt) || !strings.Contains(err.Error(), `run "d"`) || !strings.Contains(err.Error(), "index row") {
				t.Fatalf("load: %v, want ErrCorrupt naming run d's index row", err)
			}
			if len(got) != len(before) {
				t.Errorf("load: %d events decoded, want all %d with the damage", len(got), len(before))
			}
			runs, err := s.Runs(ctx)
			if err != nil || len(runs) != 1 || runs[0] != (seams.RunInfo{RunID: "d", Status: seams.StatusCorrupt}) {
				t.Fatalf("runs: %+v (%v), want d listed damaged", runs, err)
			}
			err = s.DeleteRun(ctx, "d", false)
			if !errors.Is(err, seams.ErrRunNotFinished) || !errors.Is(err, pgstore.ErrCorrupt) {
				t.Fatalf("delete without force: %v, want ErrRunNotFinished for the damage", err)
			}
			res, err := retention.Expire(ctx, s, time.Now().Add(time.Hour))
			if err != nil || len(res.Deleted) != 0 || len(res.Damaged) != 1 || res.Damaged[0] != "d" {
				t.Fatalf("retention: %+v (%v), want nothing deleted and d named damaged", res, err)
			}
			if got, _ := s.Load(ctx, "d"); len(got) != len(before) {
				t.Fatalf("the run lost events: %d left of %d", len(got), len(before))
			}
			_, err = s.Append(ctx, "d", before[len(before)-1].ID, proptest.SoundStream("d")[8])
			if !errors.Is(err, pgstore.ErrCorrupt) || !errors.Is(err, events.ErrCorruption) || !strings.Contains(err.Error(), `run "d"`) {
				t.Fatalf("append continuing the run: %v, want ErrCorrupt (which is corruption)", err)
			}
			if err := s.DeleteRun(ctx, "d", true); err != nil {
				t.Fatalf("forced delete of a damaged run: %v", err)
			}
			if got, err := s.Load(ctx, "d"); err != nil || len(got) != 0 {
				t.Fatalf("after a forced delete: %d events, %v", len(got), err)
			}
		})
	}
}

// TestOrphanedEventsAreListedDamaged: events whose runs row is gone are
// listed (corrupt, in run id order), as kv lists a stream whose index
// entry is lost, so a store-wide verify loads them and finds the damage.
func TestOrphanedEventsAreListedDamaged(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgstore.Options{})
	for _, id := range []string{"a", "c", "e"} {
		proptest.AppendEach(t, s, id, proptest.SoundStream(id))
	}
	crashed(t, s)
	exec(t, s.Schema(), `DELETE FROM {{schema}}.runs WHERE run_id IN ('d', 'e')`)
	runs, err := s.Runs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range runs {
		got = append(got, r.RunID+":"+string(r.Status))
	}
	if want := "a:finished c:finished d:corrupt e:corrupt"; strings.Join(got, " ") != want {
		t.Fatalf("runs: %s, want %s", strings.Join(got, " "), want)
	}
	if _, err := s.Load(ctx, "d"); !errors.Is(err, pgstore.ErrCorrupt) || !strings.Contains(err.Error(), "8 events but no index row") {
		t.Fatalf("load of an orphan: %v", err)
	}
}

// TestARowIsNeverTrustedOverItsStream: a crashed run's row marked
// finished with a checksum to match (an edit the checksum cannot see, or
// one made before the store kept checksums) is still damage: Load
// compares the row with its stream, and DeleteRun without force decides
// "finished" by the stream's last event, not the row.
func TestARowIsNeverTrustedOverItsStream(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgstore.Options{})
	crashed(t, s)
	stream, err := s.Load(ctx, "d")
	if err != nil {
		t.Fatal(err)
	}
	info := projections.Summarize(stream)
	info.Status = seams.StatusFinished
	exec(t, s.Schema(), `UPDATE {{schema}}.runs SET status = 'finished', crc = $1 WHERE run_id = 'd'`, int64(info.Checksum(nil)))
	if runs, err := s.Runs(ctx); err != nil || len(runs) != 1 || runs[0].Status != seams.StatusFinished {
		t.Fatalf("runs: %+v (%v): the edited row should sum to its checksum", runs, err)
	}
	_, err = s.Load(ctx, "d")
	if !errors.Is(err, pgstore.ErrCorrupt) || !strings.Contains(err.Error(), `index row of run "d" says status finished, its stream running`) {
		t.Fatalf("load: %v", err)
	}
	err = s.DeleteRun(ctx, "d", false)
	if !errors.Is(err, seams.ErrRunNotFinished) || !errors.Is(err, pgstore.ErrCorrupt) || !strings.Contains(err.Error(), "last event is step_completed") {
		t.Fatalf("delete without force: %v", err)
	}
	res, err := retention.Expire(ctx, s, time.Now().Add(time.Hour))
	if err != nil || len(res.Deleted) != 0 || fmt.Sprint(res.Damaged) != "[d]" {
		t.Fatalf("retention: %+v (%v)", res, err)
	}
	if got, _ := s.Load(ctx, "d"); len(got) != len(stream) {
		t.Fatalf("the run lost events: %d left of %d", len(got), len(stream))
	}
}

// TestADriverDoesNotWriteOverAnEditedRow: a driver holding the run's lock
// continues from the row it wrote itself, without reading it back; a row
// changed behind its back meanwhile is not written over (which would hide
// the change) but refused as damage.
func TestADriverDoesNotWriteOverAnEditedRow(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgstore.Options{})
	release, err := s.LockRun("d")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	stream := proptest.SoundStream("d")
	var tail ulid.ULID
	for _, ev := range stream[:5] {
		envs, err := s.Append(ctx, "d", tail, ev)
		if err != nil {
			t.Fatal(err)
		}
		tail = envs[0].ID
	}
	exec(t, s.Schema(), `UPDATE {{schema}}.runs SET steps = steps + 1 WHERE run_id = 'd'`)
	if _, err := s.Append(ctx, "d", tail, stream[5]); !errors.Is(err, pgstore.ErrCorrupt) || !strings.Contains(err.Error(), "fails its checksum") {
		t.Fatalf("append over an edited row: %v", err)
	}
	exec(t, s.Schema(), `UPDATE {{schema}}.runs SET steps = steps - 1 WHERE run_id = 'd'`)
	if _, err := s.Append(ctx, "d", tail, stream[5]); err != nil {
		t.Fatalf("append once the row is as written: %v", err)
	}
}

// TestMigrationChecksumsExistingRows: a store of schema version 1 (rows
// without a checksum) gets every row's checksum from the migration, and
// the column becomes NOT NULL; its runs list, load and continue as
// before, and a row edited before the migration is still found by Load,
// which compares it with its stream.
func TestMigrationChecksumsExistingRows(t *testing.T) {
	ctx := context.Background()
	old := open(t, pgstore.Options{})
	proptest.AppendEach(t, old, "a", proptest.SoundStream("a"))
	crashed(t, old)
	proptest.AppendEach(t, old, "e", proptest.SoundStream("e")[:3])
	exec(t, old.Schema(), `ALTER TABLE {{schema}}.runs DROP COLUMN crc, DROP COLUMN lease_owner, DROP COLUMN lease_expires,
	DROP COLUMN agent, DROP COLUMN failures, DROP COLUMN last_error, DROP COLUMN retry_at, DROP COLUMN cancel_by, DROP COLUMN cancel_at;
DELETE FROM {{schema}}.schema_migrations WHERE version >= 2;
UPDATE {{schema}}.runs SET status = 'finished' WHERE run_id = 'e'`)
	old.Close()

	s := open(t, pgstore.Options{Schema: old.Schema()})
	runs, err := s.Runs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range runs {
		got = append(got, fmt.Sprintf("%s:%s:%d", r.RunID, r.Status, r.Events))
	}
	// d, unfinished and held by nobody (a run without an agent), is
	// listed interrupted (seams.RunInfo.Liveness).
	if want := "a:finished:15 d:interrupted:8 e:finished:3"; strings.Join(got, " ") != want {
		t.Fatalf("runs after the migration: %s, want %s", strings.Join(got, " "), want)
	}
	for _, id := range []string{"a", "d"} {
		if _, err := s.Load(ctx, id); err != nil {
			t.Fatalf("load %s: %v", id, err)
		}
	}
	if _, err := s.Load(ctx, "e"); !errors.Is(err, pgstore.ErrCorrupt) || !strings.Contains(err.Error(), "says status finished, its stream running") {
		t.Fatalf("load of the row edited before the migration: %v", err)
	}
	proptest.AppendEach(t, s, "b", proptest.SoundStream("b")[:2])
	stream, _ := s.Load(ctx, "d")
	if _, err := s.Append(ctx, "d", stream[len(stream)-1].ID, proptest.SoundStream("d")[8]); err != nil {
		t.Fatalf("continuing a run written before the migration: %v", err)
	}
	var nullable string
	conn, err := pgx.Connect(ctx, pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	err = conn.QueryRow(ctx, `SELECT is_nullable FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'runs' AND column_name = 'crc'`, s.Schema()).Scan(&nullable)
	if err != nil || nullable != "NO" {
		t.Fatalf("crc is_nullable %q (%v), want NO", nullable, err)
	}
}
