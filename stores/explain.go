package stores

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/pgstore"
)

// Explain words err, an error of Open(target) (or of finding target's
// file), for a person: one sentence that names the store once, as
// Describe names it, and the cause once, without the packages' prefixes —
// a missing file ("no store at PATH: no such file or directory"), a file
// that is no store, a file another process holds (kv.ErrLocked), a
// PostgreSQL server that cannot be reached (the operating system's
// reason) or that refuses (the server's reason). Other errors are the
// store named once, then their text. errors.Is and errors.As see err
// through the result; Explain(target, nil) is nil.
func Explain(target string, err error) error {
	if err == nil {
		return nil
	}
	return &explained{words(target, err), err}
}

// explained is an error worded for a person; the error it words stays
// reachable for errors.Is and errors.As.
type explained struct {
	msg string
	err error
}

func (e *explained) Error() string { return e.msg }
func (e *explained) Unwrap() error { return e.err }

// words is Explain's sentence.
func words(target string, err error) string {
	store := Describe(target)
	if IsPostgres(target) {
		return postgresWords(store, err)
	}
	msg := err.Error()
	switch {
	case errors.Is(err, kv.ErrLocked):
		return lockedWords(store, msg)
	case errors.Is(err, kv.ErrNotAStore):
		why := strings.TrimPrefix(msg, kv.ErrNotAStore.Error()+": ")
		for _, p := range []string{target, store} {
			if rest, ok := strings.CutPrefix(why, p+": "); ok {
				return store + " is not a PolyLoop store: " + rest
			}
			if rest, ok := strings.CutPrefix(why, p+" "); ok {
				return store + " is not a PolyLoop store: it " + rest
			}
		}
		return store + " is not a PolyLoop store: " + why
	case errors.Is(err, fs.ErrNotExist):
		return "no store at " + store + ": " + osReason(err)
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return "cannot open " + store + ": " + osReason(err)
	}
	return named(store, msg)
}

// lockedWords words kv.ErrLocked's msg: who holds the file, how long was
// waited, and — for a reader — why the holder's socket did not answer.
func lockedWords(store, msg string) string {
	holder := "another process"
	if strings.HasPrefix(msg, kv.ErrLocked.Error()+" by this process") {
		holder = "this process (close that kv.Store first)"
	} else if i := strings.Index(msg, "(waited "); i >= 0 {
		if j := strings.IndexByte(msg[i:], ')'); j >= 0 {
			holder += " " + msg[i:i+j+1]
		}
	}
	// A reader is kept out only by a writer; it says why the writer's
	// socket did not answer it.
	if _, socket, ok := strings.Cut(msg, "; and it "); ok {
		if i := strings.LastIndex(socket, ": kv: "); i >= 0 {
			socket = socket[:i]
		}
		return store + " is held for writing by " + holder + ", which " + socket
	}
	if _, socket, ok := strings.Cut(msg, "; its socket: "); ok {
		return store + " is held for writing by " + holder + "; its socket: " + unprefixed(socket)
	}
	return store + " is held by " + holder
}

// postgresWords words an error of opening the PostgreSQL store named
// store.
func postgresWords(store string, err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return "cannot open " + store + ": " + pe.Message
	}
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		if errors.Is(err, pgstore.ErrSchemaVersion) {
			// "…: schema "s" of host=… holds no PolyLoop store …": the
			// store is named once, by Describe.
			msg := err.Error()
			if i := strings.Index(msg, "schema \""); i >= 0 {
				schema, rest := msg[i:], ""
				if j := strings.Index(schema, "\" of "); j >= 0 {
					for _, verb := range []string{" holds ", " is at version "} {
						if k := strings.Index(schema[j:], verb); k >= 0 {
							schema, rest = schema[:j+1], schema[j+k:]
							return store + ": " + schema + rest
						}
					}
				}
			}
		}
		return named(store, err.Error())
	}
	var reason string
	var oe *net.OpError
	var de *net.DNSError
	switch {
	case errors.As(err, &de):
		reason = de.Err
		if !strings.Contains(store, de.Name) {
			reason += ": " + de.Name
		}
	case errors.Is(err, context.DeadlineExceeded), pgconn.Timeout(err):
		reason = "no answer from the server"
		if ce.Config != nil && ce.Config.ConnectTimeout > 0 {
			reason += " within " + ce.Config.ConnectTimeout.String()
		}
	case errors.As(err, &oe):
		reason = osReason(oe)
	default:
		return named(store, err.Error())
	}
	if oe != nil && oe.Addr != nil {
		// The address dialled, unless the store's name already says it.
		addr := oe.Addr.String()
		host, _, splitErr := net.SplitHostPort(addr)
		if splitErr != nil || !strings.Contains(store, host) {
			reason = addr + ": " + reason
		}
	}
	return "cannot connect to " + store + ": " + reason
}

// osReason is the operating system's reason in err: the innermost error's
// text ("no such file or directory", "connection refused").
func osReason(err error) string {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err.Error()
		}
		err = next
	}
}

// named is msg without the packages' prefixes, naming store once.
func named(store, msg string) string {
	msg = unprefixed(strings.TrimPrefix(msg, store+": "))
	if strings.Contains(msg, store) {
		return msg
	}
	return store + ": " + msg
}

// unprefixed is msg without the stores' package prefixes at its start.
func unprefixed(msg string) string {
	for {
		trimmed := msg
		for _, p := range []string{"kv: ", "pgstore: ", "stores: "} {
			trimmed = strings.TrimPrefix(trimmed, p)
		}
		if trimmed == msg {
			return msg
		}
		msg = trimmed
	}
}
