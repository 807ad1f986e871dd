package kv

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// The reader socket (see "Readers of a file being written" in the package
// doc). A Store opened read-write answers other processes' reads over a
// Unix socket beside its file, with HTTP/1.1 whose bodies are msgpack.

// ProtocolVersion is the version of the reader socket's protocol. A reader
// and a writer of different versions refuse each other with
// ErrProtocolVersion.
const ProtocolVersion = "2"

// protocolHeader carries ProtocolVersion in each request and response.
const protocolHeader = "Polyloop-Kv-Protocol"

// Limits of the served reads: they must not hurt the writer.
// maxChunkBytes bounds the values copied for one reply (and one value
// more); a variable so that a test can serve a small run in many chunks.
var maxChunkBytes = 4 << 20

const (
	maxBigReads = 2 // reads of runs' values served at once; more wait

	maxServedRequests = 16  // requests served at once; more wait busyWait, then are refused as busy
	maxServedConns    = 256 // connections open at once, idle ones included; more wait to be accepted
	busyWait          = 2 * time.Second
	servedDeadline    = 30 * time.Second       // a request's read and its response's write
	maxRequestBytes   = 8 << 10                // a request's header (its body is refused)
	servedIdle        = 5 * time.Second        // how long an idle connection is kept
	stopGrace         = 500 * time.Millisecond // Close's wait for the replies of stopped reads to be sent
)

// maxSocketPath is the longest socket path the system's sockaddr_un holds
// (its sun_path, less the terminating NUL).
const maxSocketPath = 107

var (
	// ErrNotServed: a Store does not answer readers over a socket; the
	// error says why (Store.Serving).
	ErrNotServed = errors.New("kv: the store does not serve readers over a socket")
	// ErrProtocolVersion: the writer's reader socket speaks another
	// version of the protocol (ProtocolVersion).
	ErrProtocolVersion = errors.New("kv: the writer's reader socket speaks another protocol version")
	// ErrWriterGone: the process writing a file stopped answering in the
	// middle of a read over its socket (it was killed, or closed the
	// store). Open the store again: once the writer is gone the file is
	// opened directly.
	ErrWriterGone = errors.New("kv: the process writing the store stopped answering")
	// ErrUntrustedSocket: what answers, or lies, at a store's reader
	// socket is not a socket of a process of this process's user (a
	// symbolic link, another kind of file, another user's socket); a
	// reader refuses it, and a writer leaves it in place and serves no
	// readers.
	ErrUntrustedSocket = errors.New("kv: the store's reader socket is not this user's")
)

// SocketPath is the reader socket of the store file at path: path with
// ".sock" added.
func SocketPath(path string) string { return path + ".sock" }

// Serving returns the socket a read-write Store answers readers on (an
// absolute path: SocketPath of the store's absolute path), or an
// error wrapping ErrNotServed that says why it does not: opened read-only,
// Options.NoServe, a socket path too long for a Unix socket's address, or
// the listen's own failure. Open never fails for it.
func (s *Store) Serving() (socket string, err error) {
	if s.served == nil {
		return "", s.serveErr
	}
	return s.served.path, nil
}

// server is a Store's reader socket: a listener and the HTTP server on it.
type server struct {
	path    string
	srv     *http.Server
	handler *handler
	cancel  context.CancelFunc // ends every served read's context
	done    chan struct{}      // closed when Serve returned
}

// serve starts s's reader socket, or records in s.serveErr why not.
func (s *Store) serve(o Options) {
	why := func(format string, a ...any) {
		s.serveErr = fmt.Errorf("%w: %s", ErrNotServed, fmt.Sprintf(format, a...))
	}
	sock := SocketPath(s.path)
	if abs, err := filepath.Abs(sock); err == nil {
		sock = abs // removed at Close, whatever the working directory is then
	}
	switch {
	case s.readOnly:
		why("%s is opened read-only", s.path)
		return
	case o.NoServe:
		why("Options.NoServe is set")
		return
	case len(sock) > maxSocketPath:
		why("its socket path %s is %d bytes, longer than the %d a Unix socket's address holds (move the store to a shorter path)", sock, len(sock), maxSocketPath)
		return
	}
	// A socket left by a writer that died: this Store holds the file's
	// exclusive lock, so no live writer owns it. Anything else is left be.
	if fi, err := os.Lstat(sock); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			why("%s exists and is not a socket (%s); it is left as it is", sock, fi.Mode().Type())
			return
		}
		if uid, ok := fileOwner(fi); ok && uid != os.Getuid() {
			why("%s is a socket of user %d, and this process runs as user %d; it is left as it is (remove it, or keep the store in a directory of your own)", sock, uid, os.Getuid())
			return
		}
		if err := os.Remove(sock); err != nil {
			why("remove the stale socket %s: %v", sock, err)
			return
		}
	}
	l, err := listenSocket(sock)
	if err != nil {
		why("listen on %s: %v", sock, err)
		return
	}
	base, cancel := context.WithCancel(context.Background())
	sv := &server{path: sock, handler: newHandler(s), cancel: cancel, done: make(chan struct{})}
	sv.srv = &http.Server{
		Handler:           sv.handler,
		BaseContext:       func(net.Listener) context.Context { return base },
		ReadHeaderTimeout: servedDeadline,
		ReadTimeout:       servedDeadline,
		WriteTimeout:      servedDeadline,
		IdleTimeout:       servedIdle, // an idle reader's connection gives its place back soon
		MaxHeaderBytes:    maxRequestBytes,
		ErrorLog:          nil,
	}
	s.served = sv
	go func() {
		defer close(sv.done)
		sv.srv.Serve(&peerListener{Listener: l, slots: make(chan struct{}, maxServedConns)})
	}()
}

// listenSocket listens on a Unix socket at path, mode 0600. A peer that
// connects between the bind and the chmod is still checked (peerListener).
func listenSocket(path string) (net.Listener, error) {
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// stop closes the reader socket, before the store's file closes: it
// cancels the served reads (they check their context at each value) and
// waits for them, so that no read transaction keeps the file open, while
// requests that come meanwhile are answered that the writer is closing;
// then, after a short grace for the replies to be sent, it closes the
// listener (which removes the socket file) and every connection.
func (sv *server) stop() {
	sv.cancel()
	ctx, cancel := context.WithTimeout(context.Background(), stopGrace)
	defer cancel()
	sv.handler.drain(ctx)
	if sv.srv.Shutdown(ctx) != nil {
		sv.srv.Close() // a reader that does not take its reply: end its connection
	}
	sv.handler.drain(nil) // the handlers' writes end with their connections
	<-sv.done
	os.Remove(sv.path) // in case the listener did not (it removes only what it created)
}

// peerListener accepts at most cap(slots) connections at once, and only
// from processes of this process's user (checkPeer).
type peerListener struct {
	net.Listener
	slots chan struct{}
}

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		l.slots <- struct{}{}
		c, err := l.Listener.Accept()
		if err != nil {
			<-l.slots
			return nil, err
		}
		if err := checkPeer(c); err != nil {
			c.Close()
			<-l.slots
			continue
		}
		return &slotConn{Conn: c, free: func() { <-l.slots }}, nil
	}
}

// slotConn frees its listener's slot when closed.
type slotConn struct {
	net.Conn
	once sync.Once
	free func()
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.free)
	return err
}

// sameUser refuses a peer whose user id is not this process's.
func sameUser(peer int) error {
	if me := os.Getuid(); peer != me {
		return fmt.Errorf("kv: reader socket: a process of user %d connected; only user %d's are answered", peer, me)
	}
	return nil
}

// The wire: one reply type for every request, msgpack-encoded.

// wireReply is a served read's answer.
type wireReply struct {
	Err   *wireError      `msgpack:"err,omitempty"`
	Infos []seams.RunInfo `msgpack:"infos,omitempty"`
	Info  *seams.RunInfo  `msgpack:"info,omitempty"`
	// Reads is what the stream reader that read the run was handed
	// (events.StreamReader.Tee), in order; Whole, that it read the whole
	// stream (a LoadAfter answered by Load).
	Reads []wireRead `msgpack:"reads,omitempty"`
	Whole bool       `msgpack:"whole,omitempty"`
	// Next is where the next chunk of a Load starts (0: this was the
	// last), and Pin the index entry the chunks are read by.
	Next int      `msgpack:"next,omitempty"`
	Pin  *wirePin `msgpack:"pin,omitempty"`
	// Writer names the writing process (in a hello).
	Writer string `msgpack:"writer,omitempty"`
}

// wirePin is the index entry a Load in chunks is read by: its count and
// last key.
type wirePin struct {
	Events int    `msgpack:"n"`
	Last   []byte `msgpack:"last"`
}

// wireRead is one thing a stream reader was handed: a stored value, a
// value read back (Earlier, nil when unreadable), or a problem's text.
type wireRead struct {
	Key     []byte `msgpack:"k,omitempty"`
	Value   []byte `msgpack:"v,omitempty"`
	Earlier bool   `msgpack:"e,omitempty"`
	Problem string `msgpack:"p,omitempty"`
}

// wireError is an error as the writer's store returned it: its text, and
// which of the contract's errors it wraps (Kind).
type wireError struct {
	Kind string `msgpack:"kind"`
	Text string `msgpack:"text"`
}

// The kinds of wireError, with the errors they stand for.
var wireKinds = []struct {
	kind string
	err  error
}{
	{"corrupt", ErrCorrupt},
	{"invalid_run_id", seams.ErrInvalidRunID},
	{"no_run", seams.ErrNoRun},
	{"stream_changed", seams.ErrStreamChanged},
	{"closed", ErrClosed},
	{"writer_gone", ErrWriterGone},
	{"deadline", context.DeadlineExceeded},
	{"canceled", context.Canceled},
}

func toWire(err error) *wireError {
	if err == nil {
		return nil
	}
	w := &wireError{Text: err.Error()}
	for _, k := range wireKinds {
		if errors.Is(err, k.err) {
			w.Kind = k.kind
			break
		}
	}
	return w
}

// remoteError is an error the writer's store returned, as the reader
// rebuilds it: the same text, wrapping the same contract error.
type remoteError struct {
	text string
	kind error
}

func (e *remoteError) Error() string { return e.text }
func (e *remoteError) Unwrap() error { return e.kind }

func (w *wireError) err() error {
	if w == nil {
		return nil
	}
	e := &remoteError{text: w.Text}
	for _, k := range wireKinds {
		if k.kind == w.Kind {
			e.kind = k.err
		}
	}
	return e
}

// recording collects what a stream reader is handed, copied out of the
// read transaction, for a served read: the reads, whether they are the
// whole stream's, and the failure that kept a read from the stream (err).
// A nil recording records nothing.
type recording struct {
	reads []wireRead
	bytes int // of the values in reads
	whole bool
	err   error
}

func (r *recording) reset(whole bool) {
	if r != nil {
		r.reads, r.bytes, r.whole, r.err = r.reads[:0], 0, whole, nil
	}
}

// errChunkFull stops a served read that copied a chunk's bytes.
var errChunkFull = errors.New("kv: more than a chunk to send")

// each is the stream reader's Each for r: it keeps no event, and stops the
// reader once ctx ended or r holds more than a chunk's bytes.
func (r *recording) each(ctx context.Context) func(events.Envelope) error {
	return func(events.Envelope) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if r.bytes > maxChunkBytes {
			return errChunkFull
		}
		return nil
	}
}

// failed records err, a failure outside the stream reader, and returns it.
func (r *recording) failed(err error) error {
	if r != nil {
		r.err = err
	}
	return err
}

// teeFunc is the stream reader's Tee for r: nil for no recording.
func (r *recording) teeFunc() func(ulid.ULID, []byte, bool, error) {
	if r == nil {
		return nil
	}
	return r.tee
}

func (r *recording) tee(id ulid.ULID, value []byte, earlier bool, problem error) {
	w := wireRead{Earlier: earlier}
	switch {
	case problem != nil:
		w.Problem = problem.Error()
		if w.Problem == "" {
			w.Problem = "(a problem without text)"
		}
	default:
		w.Key = append([]byte(nil), id[:]...)
		if value != nil {
			w.Value = append(make([]byte, 0, len(value)), value...) // the transaction's pages are not ours to keep
			r.bytes += len(value)
		}
	}
	r.reads = append(r.reads, w)
}

// servedChunk is a streamSink for a served Load: it copies, undecoded,
// what a layout hands it from position from on (each value and problem is
// one position) until it holds more than limit bytes of values, and stops
// there, at next; it stops, too, once ctx ended, and after stopAt's value
// (the last key of a pinned read of a bucket per run, which holds the
// values appended since as well).
type servedChunk struct {
	ctx         context.Context
	from, limit int
	stopAt      ulid.ULID

	pos, bytes int
	reads      []wireRead
	full, done bool
}

// servedValueHook, when set (by tests), is called with a served Load's
// context for each value it copies.
var servedValueHook func(context.Context)

func (c *servedChunk) Value(id ulid.ULID, sealed []byte) (events.Envelope, bool) {
	if servedValueHook != nil {
		servedValueHook(c.ctx)
	}
	if c.pos >= c.from {
		c.reads = append(c.reads, wireRead{Key: append([]byte(nil), id[:]...), Value: append(make([]byte, 0, len(sealed)), sealed...)})
		c.bytes += len(sealed)
	}
	c.pos++
	c.full = c.bytes > c.limit
	c.done = c.stopAt != (ulid.ULID{}) && id == c.stopAt
	return events.Envelope{}, true
}

func (c *servedChunk) Problem(err error) {
	if c.pos >= c.from {
		c.reads = append(c.reads, wireRead{Problem: cmp.Or(err.Error(), "(a problem without text)")})
	}
	c.pos++
}

func (c *servedChunk) Stopped() bool { return c.full || c.done || c.ctx.Err() != nil }

// serveLoad reads a chunk of runID's stream for a served Load: from the
// position from, as of the index entry pin (nil: as the first chunk finds
// it). It returns the chunk's reads, the position the next chunk starts
// at (0: none), and the index entry the next chunks read by.
func (s *Store) serveLoad(ctx context.Context, runID string, from int, pin *RunInfo) (reads []wireRead, next int, by *RunInfo, err error) {
	if err := s.readable(ctx, runID); err != nil {
		return nil, 0, nil, err
	}
	c := &servedChunk{ctx: ctx, from: from, limit: maxChunkBytes}
	if _, ok := s.layout.(bucketLayout); ok && pin != nil {
		c.stopAt = pin.LastID
	}
	by, err = s.readStream(runID, c, pin)
	switch {
	case err != nil:
		return nil, 0, nil, fmt.Errorf("load run %q: %w", runID, err)
	case ctx.Err() != nil:
		return nil, 0, nil, ctx.Err()
	case c.full:
		next = c.pos
	}
	if pin != nil {
		by = pin
	}
	return c.reads, next, by, nil
}

// handler answers the reader socket's requests with s's reads, at most
// maxBigReads of runs' values at once.
type handler struct {
	store *Store
	big   chan struct{} // a place per read of runs' values
	reqs  chan struct{} // a place per request (not per connection: a kept-alive one holds none)

	mu      sync.Mutex
	active  int           // requests being answered
	closing bool          // the store is closing: no request is answered
	idle    chan struct{} // closed once closing and no request is answered
}

func newHandler(s *Store) *handler {
	return &handler{store: s, big: make(chan struct{}, maxBigReads), reqs: make(chan struct{}, maxServedRequests), idle: make(chan struct{})}
}

// enter counts a request in, unless the store is closing (false).
func (h *handler) enter() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closing {
		return false
	}
	h.active++
	return true
}

// leave counts a request out.
func (h *handler) leave() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.active--
	if h.closing && h.active == 0 {
		close(h.idle)
	}
}

// drain refuses the requests to come and waits for those being answered
// to end, or for ctx (nil: no bound).
func (h *handler) drain(ctx context.Context) {
	h.mu.Lock()
	if !h.closing {
		h.closing = true
		if h.active == 0 {
			close(h.idle)
		}
	}
	h.mu.Unlock()
	if ctx == nil {
		<-h.idle
		return
	}
	select {
	case <-h.idle:
	case <-ctx.Done():
	}
}

// bigRead waits for a place among the reads of runs' values; false when
// ctx ended first.
func (h *handler) bigRead(ctx context.Context) bool {
	select {
	case h.big <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (h *handler) bigDone() { <-h.big }

// servedTimeout says a served read ended by ctx (err) as what it is.
func servedTimeout(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("the writer's read took longer than the %v it allows one: %w", servedDeadline, err)
	}
	return &closingError{err}
}

// closingError: the writer stopped a served read because it is closing
// the store (ErrWriterGone to the reader).
type closingError struct{ err error }

func (e *closingError) Error() string   { return "the writer stopped the read: it is closing the store" }
func (e *closingError) Unwrap() []error { return []error{ErrWriterGone, e.err} }

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(protocolHeader, ProtocolVersion)
	if v := r.Header.Get(protocolHeader); v != ProtocolVersion {
		http.Error(w, fmt.Sprintf("kv: reader protocol %q; this writer speaks %q", v, ProtocolVersion), http.StatusBadRequest)
		return
	}
	if !h.enter() {
		h.reply(w, &wireReply{Err: toWire(servedTimeout(context.Canceled))})
		return
	}
	defer h.leave()
	if r.Method != http.MethodGet || r.ContentLength != 0 {
		http.Error(w, "kv: reader socket: only GET without a body", http.StatusMethodNotAllowed)
		return
	}
	select {
	case h.reqs <- struct{}{}:
		defer func() { <-h.reqs }()
	case <-time.After(busyWait):
		http.Error(w, fmt.Sprintf("busy (%d readers)", maxServedRequests), http.StatusServiceUnavailable)
		return
	case <-r.Context().Done():
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), servedDeadline)
	defer cancel()
	s, q := h.store, r.URL.Query()
	runID := q.Get("run")
	var rep wireReply
	switch r.URL.Path {
	case "/hello":
		rep.Writer = fmt.Sprintf("pid %d", os.Getpid())
	case "/runs":
		infos, err := s.Runs(ctx)
		rep.Infos, rep.Err = infos, toWire(err)
	case "/describe":
		info, err := s.Describe(ctx, runID)
		rep.Info, rep.Err = &info, toWire(err)
	case "/load":
		from, err := strconv.Atoi(cmp.Or(q.Get("from"), "0"))
		if err != nil || from < 0 {
			http.Error(w, "kv: reader socket: from is not a position", http.StatusBadRequest)
			return
		}
		var pin *RunInfo
		if q.Has("pin") {
			n, nerr := strconv.Atoi(q.Get("pin"))
			last, lerr := ulid.Parse(q.Get("last"))
			if nerr != nil || lerr != nil || n < 0 {
				http.Error(w, "kv: reader socket: pin is not a count and last a ULID", http.StatusBadRequest)
				return
			}
			pin = &RunInfo{Events: n, LastID: last}
		}
		if !h.bigRead(ctx) {
			break
		}
		reads, next, by, err := s.serveLoad(ctx, runID, from, pin) // damage is in the reads
		h.bigDone()
		rep.Reads, rep.Next, rep.Err = reads, next, toWire(err)
		if by != nil && next > 0 {
			rep.Pin = &wirePin{Events: by.Events, Last: by.LastID[:]}
		}
	case "/after":
		seen, err := strconv.Atoi(q.Get("seen"))
		if err != nil {
			http.Error(w, "kv: reader socket: seen is not a number", http.StatusBadRequest)
			return
		}
		last, err := ulid.Parse(q.Get("last"))
		if err != nil && seen > 0 {
			http.Error(w, "kv: reader socket: last is not a ULID", http.StatusBadRequest)
			return
		}
		if !h.bigRead(ctx) {
			break
		}
		var rec recording
		s.loadAfter(ctx, runID, seen, last, &rec) // past a chunk's bytes, the reader reads the whole stream in chunks
		h.bigDone()
		rep.Reads, rep.Whole, rep.Err = rec.reads, rec.whole, toWire(rec.err)
	default:
		http.Error(w, fmt.Sprintf("kv: reader socket: no %s", r.URL.Path), http.StatusNotFound)
		return
	}
	if err := ctx.Err(); err != nil {
		rep = wireReply{Err: toWire(servedTimeout(err))}
	}
	h.reply(w, &rep)
}

// reply sends rep.
func (h *handler) reply(w http.ResponseWriter, rep *wireReply) {
	body, err := msgpack.Marshal(rep) // copied, then sent: no read transaction waits on the reader
	if err != nil {
		http.Error(w, "kv: reader socket: encode: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/msgpack")
	w.Write(body)
}
