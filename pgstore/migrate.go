package pgstore

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The migrations, applied in order of their number: NNNN_what.sql, with
// {{schema}} standing for the store's schema. A migration, once released,
// never changes; a new one is added.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

var migrations = func() []migration {
	names, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		panic(err)
	}
	var out []migration
	for _, p := range names {
		base := strings.TrimPrefix(p, "migrations/")
		num, _, _ := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if err != nil {
			panic("pgstore: migration " + base + " is not named NNNN_what.sql")
		}
		b, _ := migrationFiles.ReadFile(p)
		out = append(out, migration{version: v, name: base, sql: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	for i, m := range out {
		if m.version != i+1 {
			panic(fmt.Sprintf("pgstore: migration %s: versions must run 1, 2, 3 without gaps", m.name))
		}
	}
	return out
}()

// completions finish a migration in Go where SQL cannot (a CRC-32C), in
// its transaction, after its SQL: by version.
var completions = map[int]func(ctx context.Context, tx pgx.Tx, schema string) error{
	2: checksumRows,
}

// SchemaVersion is the version of the store's tables this package reads and
// writes: the number of its last migration.
var SchemaVersion = len(migrations)

// Migrate brings the store's schema to SchemaVersion, creating the schema
// and its tables on a fresh database; on a store already at SchemaVersion
// it creates nothing (so a role without CREATE on the database can open it). It holds a transaction-scoped advisory
// lock on the schema's name, so concurrent migrators (workers starting
// together) apply each migration once; each migration and its record commit
// together. A database at a newer version is refused with ErrSchemaVersion
// naming both versions. Open calls it unless the store is read-only.
func (s *Store) Migrate(ctx context.Context) error {
	if s.readOnly {
		return ErrReadOnly
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgstore: migrate %s: %w", s.target, err)
	}
	defer tx.Rollback(ctx)
	schema := pgx.Identifier{s.schema}.Sanitize()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('polyloop migrate ' || $1, 0))`, s.schema); err != nil {
		return fmt.Errorf("pgstore: migrate: advisory lock: %w", err)
	}
	have, err := s.version(ctx, tx)
	if err != nil {
		return err
	}
	switch {
	case have > SchemaVersion:
		return s.versionError(have)
	case have == SchemaVersion:
		// Nothing to do, and nothing created: a worker whose role may not
		// create schemas opens a migrated store.
		return tx.Commit(ctx)
	}
	setup := `CREATE SCHEMA IF NOT EXISTS ` + schema + `;
CREATE TABLE IF NOT EXISTS ` + schema + `.schema_migrations (
	version    integer     PRIMARY KEY,
	name       text        NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now()
)`
	if _, err := tx.Exec(ctx, setup); err != nil {
		return fmt.Errorf("pgstore: migrate: create schema %s: %w", schema, err)
	}
	for _, m := range migrations[have:] {
		if _, err := tx.Exec(ctx, strings.ReplaceAll(m.sql, "{{schema}}", schema)); err != nil {
			return fmt.Errorf("pgstore: migration %s: %w", m.name, err)
		}
		if complete := completions[m.version]; complete != nil {
			if err := complete(ctx, tx, schema); err != nil {
				return fmt.Errorf("pgstore: migration %s: %w", m.name, err)
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.schema_migrations (version, name) VALUES ($1, $2)`, m.version, m.name); err != nil {
			return fmt.Errorf("pgstore: record migration %s: %w", m.name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgstore: migrate: commit: %w", err)
	}
	return nil
}

// checkVersion refuses a schema at another version than SchemaVersion: a
// read-only store migrates nothing.
func (s *Store) checkVersion(ctx context.Context) error {
	have, err := s.version(ctx, s.pool)
	if err != nil {
		return err
	}
	if have != SchemaVersion {
		return s.versionError(have)
	}
	return nil
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// version is the schema's version: its last recorded migration, 0 when it
// has none (or no PolyLoop tables at all).
func (s *Store) version(ctx context.Context, q querier) (int, error) {
	var exists bool
	err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{s.schema, "schema_migrations"}.Sanitize()).Scan(&exists)
	if err != nil {
		return 0, fmt.Errorf("pgstore: read schema version of %s: %w", s.schema, err)
	}
	if !exists {
		return 0, nil
	}
	var have int
	err = q.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+pgx.Identifier{s.schema, "schema_migrations"}.Sanitize()).Scan(&have)
	if err != nil {
		return 0, fmt.Errorf("pgstore: read schema version of %s: %w", s.schema, err)
	}
	return have, nil
}

func (s *Store) versionError(have int) error {
	if have == 0 {
		return fmt.Errorf("%w: schema %q of %s holds no PolyLoop store (version 0; this package reads version %d): open it read-write once to create it",
			ErrSchemaVersion, s.schema, s.target, SchemaVersion)
	}
	return fmt.Errorf("%w: schema %q of %s is at version %d, this package reads and writes version %d",
		ErrSchemaVersion, s.schema, s.target, have, SchemaVersion)
}

// checksumRows completes migration 2: every runs row written before the
// store kept a checksum gets one, over its values as they stand (a row
// changed before the migration then sums, but Load still compares every
// row with its stream and reports one the stream contradicts), and the
// column becomes NOT NULL, so no row goes without.
func checksumRows(ctx context.Context, tx pgx.Tx, schema string) error {
	rows, err := tx.Query(ctx, `SELECT `+rowColumns("")+` FROM `+schema+`.runs WHERE crc IS NULL`)
	if err != nil {
		return fmt.Errorf("read the runs rows: %w", err)
	}
	var (
		ids  []string
		sums []int64
		sc   rowScan
	)
	for rows.Next() {
		if err := rows.Scan(sc.dest()...); err != nil {
			rows.Close()
			return fmt.Errorf("read the runs rows: %w", err)
		}
		// The table's constraints hold every column but crc non-null.
		ids, sums = append(ids, *sc.runID), append(sums, int64(rowSum(sc.info())))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the runs rows: %w", err)
	}
	if _, err := tx.Exec(ctx, `UPDATE `+schema+`.runs r SET crc = t.crc FROM unnest($1::text[], $2::bigint[]) AS t(run_id, crc) WHERE r.run_id = t.run_id`, ids, sums); err != nil {
		return fmt.Errorf("write the runs rows' checksums: %w", err)
	}
	if _, err := tx.Exec(ctx, `ALTER TABLE `+schema+`.runs ALTER COLUMN crc SET NOT NULL`); err != nil {
		return fmt.Errorf("make the runs rows' checksum NOT NULL: %w", err)
	}
	return nil
}
