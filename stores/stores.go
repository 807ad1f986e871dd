// Package stores opens the store a command-line argument names: a bbolt
// file path (package kv) or a PostgreSQL connection string (package
// pgstore) in any form pgx accepts — a postgres:// or postgresql:// URL,
// the scheme in any case, or libpq's keyword/value string. It is the one
// place that choice is made, so polyloop-demo, polyloop-inspect,
// polyloop-admin and the examples accept every form without repeating it,
// and the one place a store's location is made fit to print: Describe
// masks every password, Open's errors hold none, and Explain words them
// for a person, naming the store once.
//
// What does not live here: the stores themselves and their rules.
package stores

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/seams"
)

// Store is what every store offers: the RunStore seam, the read interface,
// and Close.
type Store interface {
	seams.RunStore
	seams.RunReader
	io.Closer
}

// Options configure Open; each store reads the ones that concern it.
type Options struct {
	// ReadOnly opens for reading only (both stores); a bbolt file is read
	// while another process writes it (kv.OpenReader).
	ReadOnly bool
	// LockTimeout bounds the wait for a bbolt file another process holds
	// without serving readers (kv.Options.LockTimeout).
	LockTimeout time.Duration
	// ConnectTimeout bounds connecting to PostgreSQL
	// (pgstore.Options.ConnectTimeout).
	ConnectTimeout time.Duration
}

// IsPostgres reports whether target names a PostgreSQL database rather
// than a file: a postgres:// or postgresql:// URL (the scheme in any case)
// or a libpq keyword/value string (host=db dbname=agents …), the forms pgx
// accepts. A keyword/value string is known by its start, a keyword and '=';
// a file whose name starts so is named with a directory (./host=x.db).
func IsPostgres(target string) bool { return formOf(target) != formFile }

// Open opens target: a PostgreSQL connection string (IsPostgres) with
// pgstore, in the schema its polyloop_schema parameter names
// (pgstore.DefaultSchema without one), anything else as a bbolt file with
// kv — read-write with kv.Open (a file another process holds is
// kv.ErrLocked: its writer must stop first), read-only with kv.OpenReader,
// which holds the file only while one read lasts and, while another
// process writes the file, reads through that process's reader socket: an
// agent that starts during a read waits for the file up to its
// LockTimeout, which a read of a large run may outlast (give such an agent
// a longer one). Its errors never hold a password: a connection string is
// named as Describe names it, and one that pgx would misread or quote in
// part in its error (a URL whose password holds an unencoded '@', '/' or '&', a
// keyword/value string that stops making sense) is refused, saying why.
func Open(ctx context.Context, target string, o Options) (Store, error) {
	dsn, problem := target, ""
	switch formOf(target) {
	case formFile:
		if o.ReadOnly {
			return kv.OpenReader(target, kv.Options{LockTimeout: o.LockTimeout})
		}
		return kv.Open(target, kv.Options{LockTimeout: o.LockTimeout})
	case formURL:
		u := parseURL(target)
		dsn, problem = u.String(), u.problem()
	case formKeywordValue:
		_, problem = maskKeywordValue(target)
	}
	// What pgx would misread it leaves unsaid, or quotes in its error.
	if problem != "" {
		return nil, fmt.Errorf("stores: %s does not parse: %s", Describe(target), problem)
	}
	s, err := pgstore.Open(ctx, dsn, pgstore.Options{ReadOnly: o.ReadOnly, ConnectTimeout: o.ConnectTimeout})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Describe(target), err)
	}
	return s, nil
}

// Describe names target for a message: a file's absolute path, a
// connection string as written but with every password masked (a URL's
// user password, password and sslpassword parameters), the scheme of a URL
// in lower case. Where a string stops making sense the rest is withheld,
// and a URL whose password holds unencoded delimiters is masked up to its
// last '@', since part of it could be a password either way.
func Describe(target string) string {
	switch formOf(target) {
	case formURL:
		return parseURL(target).masked()
	case formKeywordValue:
		masked, _ := maskKeywordValue(target)
		return masked
	}
	if abs, err := filepath.Abs(target); err == nil {
		return abs
	}
	return target
}
