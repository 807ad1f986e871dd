package kv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// maxReplyBytes bounds a served read's reply a reader accepts: a run's
// events, every one at most events.MaxPayload, or a listing.
const maxReplyBytes = 1 << 30

// helloTimeout bounds Dial's exchange with the writer.
const helloTimeout = 5 * time.Second

// Remote reads a store file that another process has open for writing,
// through that process's reader socket (Store.Serving): the reads of a
// read-only Store — Runs, Load, LoadAfter, Describe — answered by the
// writer from its read transactions, so they see every committed event
// (see the package doc on when a commit is visible). Events come as the writer stored them and are decoded
// and checked here (checksums included), so damage is reported as Load
// reports it. Writes are refused with ErrReadOnly. Safe for concurrent use.
//
// When the writer stops answering — it was killed, or closed the store —
// a read fails with an error wrapping ErrWriterGone; the file is then no
// longer held, and OpenReader (or Open) reads it directly.
type Remote struct {
	path, socket string
	writer       string // the writing process, as it names itself
	client       *http.Client
	closed       atomic.Bool
}

var (
	_ seams.RunStore     = (*Remote)(nil)
	_ seams.RunReader    = (*Remote)(nil)
	_ seams.RunTailer    = (*Remote)(nil)
	_ seams.RunDescriber = (*Remote)(nil)
	_ seams.RunScanner   = (*Remote)(nil)
)

// errNoSocket: nothing answers on the file's reader socket: no socket
// (no writer, or one that does not serve), or one nobody listens on (a
// writer that died).
var errNoSocket = errors.New("kv: no process answers on the store's reader socket")

// Dial connects to the reader socket of the store file at path, which
// another process (or a Store of this one) has open for writing. An error
// wrapping ErrProtocolVersion when the writer speaks another version of
// the protocol; one that says nothing answers when no writer serves the
// file.
func Dial(path string) (*Remote, error) {
	sock := SocketPath(path)
	dialer := net.Dialer{}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			if err := checkSocket(sock); err != nil {
				return nil, err
			}
			c, err := dialer.DialContext(ctx, "unix", sock)
			if err != nil {
				return nil, &dialError{err}
			}
			if err := checkWriter(c, sock); err != nil {
				c.Close()
				return nil, err
			}
			return c, nil
		},
		MaxIdleConns:          1, // the writer serves a few connections at once: take few
		MaxIdleConnsPerHost:   1,
		MaxConnsPerHost:       2,
		IdleConnTimeout:       servedIdle / 2,
		DisableCompression:    true,
		ResponseHeaderTimeout: servedDeadline + servedDeadline/2,
	}
	r := &Remote{path: path, socket: sock, client: &http.Client{Transport: tr}}
	var rep wireReply
	ctx, cancel := context.WithTimeout(context.Background(), helloTimeout)
	defer cancel()
	if err := r.get(ctx, "hello", "/hello", nil, &rep); err != nil {
		tr.CloseIdleConnections()
		var de *dialError
		if errors.As(err, &de) {
			return nil, fmt.Errorf("%w (%s: %w)", errNoSocket, sock, de)
		}
		return nil, err
	}
	r.writer = rep.Writer
	return r, nil
}

// checkSocket refuses what is at sock unless it is a socket of this
// process's user: a symbolic link, anything else, or another user's socket
// (in a shared directory another user could put one where a store's
// belongs, and answer its reads) is refused with ErrUntrustedSocket. No
// file at all is a dialError: nothing answers.
func checkSocket(sock string) error {
	fi, err := os.Lstat(sock)
	if err != nil {
		return &dialError{err}
	}
	switch t := fi.Mode().Type(); {
	case t == fs.ModeSymlink:
		return fmt.Errorf("%w: %s is a symbolic link, not a writer's socket (remove it)", ErrUntrustedSocket, sock)
	case t != fs.ModeSocket:
		return fmt.Errorf("%w: %s is not a socket (%v)", ErrUntrustedSocket, sock, t)
	}
	if uid, ok := fileOwner(fi); ok && uid != os.Getuid() {
		return fmt.Errorf("%w: %s belongs to user %d, and this process runs as user %d (in a shared directory another user may have put it there: remove it, or keep the store in a directory of your own)",
			ErrUntrustedSocket, sock, uid, os.Getuid())
	}
	return nil
}

// answeredBy refuses a process of user uid answering on sock unless it is
// this process's user.
func answeredBy(sock string, uid int) error {
	if me := os.Getuid(); uid != me {
		return fmt.Errorf("%w: the process answering on %s runs as user %d, and this process as user %d",
			ErrUntrustedSocket, sock, uid, me)
	}
	return nil
}

// dialError is a connection to the socket that could not be made.
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// gone says the writer stopped answering during what (an error wrapping
// ErrWriterGone); unsent when the request never reached a writer (its
// socket is gone, as a writer that closed its store leaves it, or refuses
// connections, as a killed one leaves it), so reading the file instead
// answers it.
func (r *Remote) gone(what string, err error) error {
	var de *dialError
	switch {
	case errors.As(err, &de) && errors.Is(de.err, fs.ErrNotExist):
		return &goneError{fmt.Sprintf("%s: %s: the process writing it stopped answering (its socket is gone: it closed the store); the file can be read directly now",
			r.path, what), err, true}
	case errors.As(err, &de):
		return &goneError{fmt.Sprintf("%s: %s: the process writing it stopped answering (its socket refuses connections: it was killed); the file can be read directly now",
			r.path, what), err, true}
	}
	return &goneError{fmt.Sprintf("%s: %s: the process writing it stopped answering in the middle of the read (%v: it was killed, or closed the store); the file can be read directly now",
		r.path, what, osCause(err)), err, false}
}

// goneError is ErrWriterGone's error (and its cause's), unsent when the
// request never reached a writer or the writer did not read for it.
type goneError struct {
	msg    string
	cause  error
	unsent bool
}

func (e *goneError) Error() string   { return e.msg }
func (e *goneError) Unwrap() []error { return []error{ErrWriterGone, e.cause} }

// get asks the writer for path with query q and decodes its reply.
func (r *Remote) get(ctx context.Context, what, path string, q url.Values, rep *wireReply) error {
	if r.closed.Load() {
		return ErrClosed
	}
	u := url.URL{Scheme: "http", Host: "polyloop-kv", Path: path, RawQuery: q.Encode()}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	req.Header.Set(protocolHeader, ProtocolVersion)
	resp, err := r.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // not the request's made-up URL
		}
		var de *dialError
		if what == "hello" && errors.As(err, &de) || errors.Is(err, ErrUntrustedSocket) {
			return err
		}
		return r.gone(what, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxReplyBytes+1))
	switch {
	case err != nil && ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		return r.gone(what, err)
	case len(body) > maxReplyBytes:
		return fmt.Errorf("%s: %s: the writer's reply is more than %d bytes", r.path, what, maxReplyBytes)
	}
	if v := resp.Header.Get(protocolHeader); v != ProtocolVersion {
		return fmt.Errorf("%w: the process writing %s speaks reader protocol %q, this reader %q (use a polyloop of the writer's version, or stop the writer to read the file directly)",
			ErrProtocolVersion, r.path, v, ProtocolVersion)
	}
	if resp.StatusCode == http.StatusServiceUnavailable {
		return fmt.Errorf("%s: %s: the writer is %s; try again", r.path, what, bytes.TrimSpace(body))
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: the writer refused the request: %s", r.path, what, unprefixed(bytes.TrimSpace(body)))
	}
	if err := msgpack.Unmarshal(body, rep); err != nil {
		return fmt.Errorf("%s: %s: the writer's reply does not decode: %w", r.path, what, err)
	}
	err = rep.Err.err()
	if errors.Is(err, ErrWriterGone) { // it is closing the store: it read nothing
		return &goneError{fmt.Sprintf("%s: %s: the process writing it stopped the read: it is closing the store; the file can be read directly once it has", r.path, what), err, true}
	}
	return err
}

// Path is the file the writer serves.
func (r *Remote) Path() string { return r.path }

// Writer names the process that answers (its pid).
func (r *Remote) Writer() string { return r.writer }

// Close ends the connections; later reads fail with ErrClosed.
func (r *Remote) Close() error {
	r.closed.Store(true)
	r.client.CloseIdleConnections()
	return nil
}

// Parameters implements seams.RunStore as Store does.
func (r *Remote) Parameters() map[string]string {
	return map[string]string{"kind": "bbolt", "schema_version": events.CurrentSchemaVersion}
}

// Append implements seams.RunStore: a Remote only reads (ErrReadOnly).
func (r *Remote) Append(context.Context, string, ulid.ULID, ...events.Event) ([]events.Envelope, error) {
	return nil, ErrReadOnly
}

// Runs implements seams.RunReader: the writer's listing, holders included.
func (r *Remote) Runs(ctx context.Context) ([]RunInfo, error) {
	var rep wireReply
	if err := r.get(ctx, "list runs", "/runs", nil, &rep); err != nil {
		return nil, err
	}
	return rep.Infos, nil
}

// Describe implements seams.RunDescriber.
func (r *Remote) Describe(ctx context.Context, runID string) (RunInfo, error) {
	var rep wireReply
	if err := r.get(ctx, fmt.Sprintf("describe run %q", clip(runID, 80)), "/describe", url.Values{"run": {runID}}, &rep); err != nil {
		return RunInfo{}, err
	}
	if rep.Info == nil {
		return RunInfo{}, fmt.Errorf("%s: describe run %q: the writer's reply holds no entry", r.path, clip(runID, 80))
	}
	return *rep.Info, nil
}

// Load implements seams.RunStore: as Store.Load, from the values the
// writer read, checked here. A big run comes in chunks of a few MiB, each
// the writer's read of its own, all as of the index entry the first read
// (so a run appended meanwhile reads as it stood then).
func (r *Remote) Load(ctx context.Context, runID string) ([]events.Envelope, error) {
	return r.load(ctx, runID, nil)
}

// Scan implements seams.RunScanner as Store.Scan does, from the values
// the writer read (a chunk at a time: fn may stop the read).
func (r *Remote) Scan(ctx context.Context, runID string, fn func(events.Envelope) error) error {
	_, err := r.load(ctx, runID, fn)
	return err
}

// load is Load, or with each set Scan: the writer's chunks handed to a
// stream reader in turn.
func (r *Remote) load(ctx context.Context, runID string, each func(events.Envelope) error) ([]events.Envelope, error) {
	sr := events.StreamReader{RunID: runID, Each: each}
	what := fmt.Sprintf("load run %q", clip(runID, 80))
	q := url.Values{"run": {runID}}
	for {
		var rep wireReply
		if err := r.get(ctx, what, "/load", q, &rep); err != nil {
			return nil, err
		}
		hand(&sr, rep.Reads)
		if rep.Next == 0 || sr.Stopped() {
			break
		}
		if rep.Next <= atoi(q.Get("from")) {
			return nil, fmt.Errorf("%s: %s: the writer's next chunk starts at %d, not after %s", r.path, what, rep.Next, q.Get("from"))
		}
		q.Set("from", strconv.Itoa(rep.Next))
		if rep.Pin != nil && len(rep.Pin.Last) == len(ulid.ULID{}) {
			q.Set("pin", strconv.Itoa(rep.Pin.Events))
			q.Set("last", ulid.ULID(rep.Pin.Last).String())
		}
	}
	return loaded(runID, &sr)
}

// atoi is s as a number, 0 when it is none.
func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// LoadAfter implements seams.RunTailer as Store.LoadAfter does: the writer
// sends the events after the first seen when they are a chunk's bytes at
// most and it finds them as LoadAfter would; otherwise the whole stream is
// read (Load) and cut as Store.LoadAfter cuts it.
func (r *Remote) LoadAfter(ctx context.Context, runID string, seen int, last ulid.ULID) ([]events.Envelope, error) {
	var rep wireReply
	q := url.Values{"run": {runID}, "seen": {strconv.Itoa(seen)}, "last": {last.String()}}
	if err := r.get(ctx, fmt.Sprintf("load run %q", clip(runID, 80)), "/after", q, &rep); err != nil {
		return nil, err
	}
	if rep.Whole {
		stream, err := r.Load(ctx, runID)
		return seams.StreamAfter(runID, stream, err, seen, last)
	}
	return replay(runID, rep.Reads, nil)
}

// replay hands a stream reader what the writer's was handed, and returns
// what Store.Load returns from it (with each set, Store.Scan).
func replay(runID string, reads []wireRead, each func(events.Envelope) error) ([]events.Envelope, error) {
	var earlier []wireRead
	for _, w := range reads {
		if w.Earlier {
			earlier = append(earlier, w)
		}
	}
	r := events.StreamReader{RunID: runID, Each: each}
	if len(earlier) > 0 {
		r.Earlier = func(yield func(ulid.ULID, []byte) bool) {
			for _, w := range earlier {
				if !yield(ulid.ULID(w.Key), w.Value) {
					return
				}
			}
		}
	}
	hand(&r, reads)
	return loaded(runID, &r)
}

// hand gives r the values and problems in reads (those read back,
// Earlier's, aside).
func hand(r *events.StreamReader, reads []wireRead) {
	for _, w := range reads {
		if r.Stopped() {
			return
		}
		switch {
		case w.Earlier:
		case w.Problem != "":
			r.Problem(errors.New(w.Problem))
		case len(w.Key) != len(ulid.ULID{}):
			r.Problem(fmt.Errorf("the writer sent a key of %d bytes", len(w.Key)))
		default:
			r.Value(ulid.ULID(w.Key), w.Value)
		}
	}
}

// unprefixed is a refusal's text without the "kv: " its writer put first.
func unprefixed(body []byte) string { return strings.TrimPrefix(string(body), "kv: ") }
