// Package stores opens the store a command-line argument names: a bbolt
// file path (package kv) or a postgres:// URL (package pgstore). It is the
// one place that choice is made, so polyloop-demo, polyloop-inspect,
// polyloop-admin and the examples accept both without repeating it.
//
// What does not live here: the stores themselves and their rules.
package stores

import (
	"context"
	"io"
	"net/url"
	"path/filepath"
	"strings"
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
	// ReadOnly opens for reading only (both stores).
	ReadOnly bool
	// LockTimeout bounds the wait for a bbolt file another process holds
	// (kv.Options.LockTimeout).
	LockTimeout time.Duration
	// ConnectTimeout bounds connecting to PostgreSQL
	// (pgstore.Options.ConnectTimeout).
	ConnectTimeout time.Duration
}

// IsURL reports whether target names a PostgreSQL database rather than a
// file.
func IsURL(target string) bool {
	return strings.HasPrefix(target, "postgres://") || strings.HasPrefix(target, "postgresql://")
}

// Open opens target: a postgres:// (or postgresql://) URL with pgstore, in
// the schema its polyloop_schema parameter names (pgstore.DefaultSchema
// without one), anything else as a bbolt file with kv.
func Open(ctx context.Context, target string, o Options) (Store, error) {
	if IsURL(target) {
		return pgstore.Open(ctx, target, pgstore.Options{ReadOnly: o.ReadOnly, ConnectTimeout: o.ConnectTimeout})
	}
	return kv.Open(target, kv.Options{ReadOnly: o.ReadOnly, LockTimeout: o.LockTimeout})
}

// Describe names target for a message: a file's absolute path, a URL
// without its password.
func Describe(target string) string {
	if !IsURL(target) {
		if abs, err := filepath.Abs(target); err == nil {
			return abs
		}
		return target
	}
	u, err := url.Parse(target)
	if err != nil {
		return "a postgres:// URL that does not parse"
	}
	q := u.Query()
	for _, k := range []string{"password", "sslpassword"} {
		if q.Has(k) {
			q.Set(k, "xxxxx")
		}
	}
	u.RawQuery = q.Encode()
	return u.Redacted()
}
