package events

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/oklog/ulid/v2"
	"github.com/vmihailenco/msgpack/v5"
)

// CurrentSchemaVersion is the codec's schema version, "major.minor". A reader
// accepts any minor of a major it knows and refuses other majors. 1.1 added
// the envelope's checksum; 1.2 an env_error's cause (ActionOutcome.EnvError),
// a reply's token usage (ModelReply.Usage), the stop reason token_budget and
// zstd-compressed payloads; 1.3 S2-compressed payloads and references by
// which a step stores each text once (doc.go, "Schema 1.3"); 1.4 the agent
// and input a run was started for (RunStarted.Agent, RunStarted.Input); 1.5
// human decisions (Intent.Awaits, Intent.Arguments, Intent.ArgumentsSchema
// and the Decision record); 1.6 forks (RunStarted.Fork).
const CurrentSchemaVersion = "1.6"

// currentMajor is the major of CurrentSchemaVersion.
const currentMajor = 1

// Envelope is one stored value: the event's ULID (its key in the stream), its
// kind, the schema version it was encoded with, and the event itself.
type Envelope struct {
	ID            ulid.ULID
	Kind          Kind
	SchemaVersion string
	Event         Event
}

// Time is the millisecond at which the event's ULID was minted, i.e. when the
// store appended it.
func (e Envelope) Time() time.Time { return ulid.Time(e.ID.Time()) }

// Sentinel decoding errors; a *DecodeError wraps exactly one of them.
var (
	// ErrMalformed: the bytes are not a msgpack envelope.
	ErrMalformed = errors.New("events: malformed envelope")
	// ErrMissingVersion: the envelope carries no schema version.
	ErrMissingVersion = errors.New("events: schema version missing")
	// ErrUnknownMajor: the schema version's major is not one this codec reads.
	ErrUnknownMajor = errors.New("events: unknown schema major version")
	// ErrUnknownKind: the kind is not one of the six records.
	ErrUnknownKind = errors.New("events: unknown event kind")
	// ErrPayloadMismatch: the payload does not decode as, or is not a valid,
	// record of the envelope's kind.
	ErrPayloadMismatch = errors.New("events: payload does not match its kind")
	// ErrChecksum: the value's checksum does not match its run id, key and
	// bytes, or a value of schema 1.1 or later carries none.
	ErrChecksum = errors.New("events: checksum mismatch")
)

// DecodeError says why a stored value could not be decoded.
type DecodeError struct {
	ID     ulid.ULID // the key the value was stored under, when known
	Kind   Kind      // the kind the envelope claimed, when it got that far
	Err    error     // one of the sentinel errors above
	Detail string    // what exactly was wrong
}

func (e *DecodeError) Error() string {
	var b strings.Builder
	b.WriteString(e.Err.Error())
	if e.ID != (ulid.ULID{}) {
		fmt.Fprintf(&b, " (event %s", e.ID)
		if e.Kind != "" {
			fmt.Fprintf(&b, ", kind %s", e.Kind)
		}
		b.WriteString(")")
	} else if e.Kind != "" {
		fmt.Fprintf(&b, " (kind %s)", e.Kind)
	}
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	return b.String()
}

// Unwrap returns the sentinel error.
func (e *DecodeError) Unwrap() error { return e.Err }

// wireEnvelope is the stored shape. Payload stays raw until the kind is known.
type wireEnvelope struct {
	Kind          string     `msgpack:"kind"`
	SchemaVersion *string    `msgpack:"schema_version"`
	Payload       rawInPlace `msgpack:"payload"`
	PayloadZ      binInPlace `msgpack:"payload_z"`  // the payload compressed (zstd), written by 1.2
	PayloadS2     binInPlace `msgpack:"payload_s2"` // the payload compressed (S2 block), since 1.3
	Refs          *stepRefs  `msgpack:"refs"`       // fields derived from others (refs.go), since 1.3
	CRC           *uint32    `msgpack:"crc"`
}

// Compression: a payload of at least compressMin bytes is stored
// S2-compressed (key payload_s2, since 1.3) when that saves at least an
// eighth of it. A step's texts repeat inside its StepCompleted (the reply
// as raw_output and action, the observation in the outcome and the
// record), and LLM text compresses besides; the checksum covers the
// compressed bytes, as stored. Decompression is bounded by MaxPayload.
//
// Why S2 and not zstd, which 1.2 wrote (payload_z, still read): on a
// step's texts (a 2 KB reply and a 4 KB observation, repeated as a
// StepCompleted repeated them before 1.3's references) zstd's fastest level
// took 45 µs for 3,898 bytes, S2's Encode 10 µs for 5,253 (EncodeBetter 20
// µs for 4,823), and at 64 concurrent runs on 2 cores zstd was 44 % of the
// process's CPU — the CPU the store's commits need. With references
// (refs.go) a step stores each text once, and S2's Encode keeps it at 0.94x
// its payload on disk (EncodeBetter: 0.93x), so the cheaper encoder is used
// (BenchmarkStorageBytes, BenchmarkConcurrentTextRuns).
const compressMin = 1024

// MaxPayload is the largest payload, in bytes of msgpack before
// compression, that a stored value carries. Marshal refuses a larger event
// with ErrTooLarge, and Unmarshal decompresses any payload up to it, so
// whatever a store accepted it reads back. (The bound on reading keeps a
// forged value from making a reader allocate without limit; values written
// uncompressed are read whatever their size.)
const MaxPayload = 64 << 20

// MaxTextBytes bounds each text the engine stores from a consumer: a model
// reply (its content, thinking and call id together), what a parser
// derives from it, an observation. A step record holds a handful of them
// (the reply as raw_output, the action, its arguments, the observation, and
// the observation again wrapped in a template of at most the same size), at
// most 48 MiB with each at its bound: under MaxPayload.
const MaxTextBytes = 8 << 20

// ErrTooLarge: an event's payload is larger than MaxPayload. Nothing of
// the append that carried it is written.
var ErrTooLarge = errors.New("events: event too large to store")

var (
	zDecoder, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(MaxPayload),
		zstd.WithDecoderMaxWindow(8<<20))
)

// castagnoli is CRC-32C's table, the checksum of pebble's and etcd's logs.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// crcTrailer is how every value since 1.1 ends: the key "crc" and a msgpack
// uint32 (0xce and four bytes, big-endian) that Seal fills in.
var crcTrailer = []byte{0xa3, 'c', 'r', 'c', 0xce, 0, 0, 0, 0}

// checksum is the CRC-32C of the run id (length first), the key, and the
// value's bytes before its checksum: so it covers the kind, the schema
// version and the payload, and a value moved to another key or run fails.
func checksum(runID string, id ulid.ULID, body []byte) uint32 {
	var n [binary.MaxVarintLen64]byte
	h := crc32.Update(0, castagnoli, n[:binary.PutUvarint(n[:], uint64(len(runID)))])
	h = crc32.Update(h, castagnoli, []byte(runID))
	h = crc32.Update(h, castagnoli, id[:])
	return crc32.Update(h, castagnoli, body)
}

// endsWithChecksum reports whether b ends with the checksum field as
// Marshal writes it (the key "crc" and a four-byte uint32).
func endsWithChecksum(b []byte) bool {
	return len(b) >= len(crcTrailer) && bytes.Equal(b[len(b)-len(crcTrailer):len(b)-4], crcTrailer[:5])
}

// Seal writes the checksum of a value from Marshal, stored under key id in
// runID's stream, into its last four bytes. Stores call it once they have
// minted the key; Unmarshal verifies it.
func Seal(b []byte, runID string, id ulid.ULID) error {
	if !endsWithChecksum(b) {
		return errors.New("events: seal: the value does not end with a checksum field (not from Marshal)")
	}
	binary.BigEndian.PutUint32(b[len(b)-4:], checksum(runID, id, b[:len(b)-4]))
	return nil
}

// Reseal seals a stored value copied into runID's stream under key id (a
// fork's copy): as Seal, except that a value stored before checksums
// (schema 1.0) carries none, is tied to no run or key, and is copied as
// it is.
func Reseal(b []byte, runID string, id ulid.ULID) error {
	if !endsWithChecksum(b) {
		return nil
	}
	return Seal(b, runID, id)
}

// SealedChecksum is the checksum a sealed value carries, for stores that
// keep it beside the value too; ok is false for a value without one (1.0).
func SealedChecksum(b []byte) (sum uint32, ok bool) {
	if !endsWithChecksum(b) {
		return 0, false
	}
	return binary.BigEndian.Uint32(b[len(b)-4:]), true
}

var encoders = sync.Pool{New: func() any {
	p := &pooledEncoder{buf: new(bytes.Buffer), payloadBuf: new(bytes.Buffer)}
	p.enc, p.payload = msgpack.NewEncoder(p.buf), msgpack.NewEncoder(p.payloadBuf)
	p.enc.SetSortMapKeys(true) // deterministic bytes for golden files
	p.payload.SetSortMapKeys(true)
	return p
}}

type pooledEncoder struct {
	buf        *bytes.Buffer // the envelope
	enc        *msgpack.Encoder
	payloadBuf *bytes.Buffer // the payload, encoded first to decide on compression
	payload    *msgpack.Encoder
	z          []byte // the compressed payload, reused (copied into buf before the encoder goes back to the pool)
}

// maxPooledBytes bounds the buffers an encoder keeps between events: one
// large event's (up to MaxPayload, several times over) are left to the
// collector rather than held for the small ones that follow.
const maxPooledBytes = 4 << 20

// release returns p to the pool, unless its buffers grew past
// maxPooledBytes.
func (p *pooledEncoder) release() {
	if p.buf.Cap()+p.payloadBuf.Cap()+cap(p.z) > maxPooledBytes {
		return
	}
	encoders.Put(p)
}

// Marshal encodes ev as a stored value (kind, CurrentSchemaVersion, payload,
// and a checksum field for Seal to fill in once the value's key is known).
// It refuses an event that fails Validate, so nothing invalid is written.
func Marshal(ev Event) ([]byte, error) { return AppendMarshalAfter(nil, ev, nil) }

// AppendMarshalAfter is Marshal appending the value to dst, so a store can
// encode behind a header of its own without copying the value again, for
// a writer that may know the content of the latest model reply before ev
// in its run's stream (lastReply; nil when unknown or none): a
// StepCompleted repeating it may refer to it instead of storing it again
// (refs.go). The value must then be stored
// right where the writer said, which a store's expected-tail check ensures.
func AppendMarshalAfter(dst []byte, ev Event, lastReply *string) ([]byte, error) {
	if ev == nil {
		return nil, errors.New("events: marshal of a nil event")
	}
	if err := ev.Validate(); err != nil {
		return nil, fmt.Errorf("events: invalid %s: %w", ev.Kind(), err)
	}
	p := encoders.Get().(*pooledEncoder)
	defer p.release()
	p.buf.Reset()
	payloadKey, payload, refs, err := p.encodePayload(ev, lastReply)
	if err != nil {
		return nil, fmt.Errorf("events: encode %s: %w", ev.Kind(), err)
	}
	// The fields in a fixed order, the checksum last. Written call by call:
	// a slice of the fields as []any cost an allocation and a boxing per
	// field, with every event every run appends. The payload's bytes go
	// from the encoder's buffer straight into dst, behind the header p.buf
	// holds: through p.buf they were copied twice, and a large payload's
	// was a second buffer of its size.
	fields := 4
	if refs != nil {
		fields++
	}
	e := p.enc
	err = e.EncodeMapLen(fields)
	str := func(s string) {
		if err == nil {
			err = e.EncodeString(s)
		}
	}
	str("kind")
	str(string(ev.Kind()))
	str("schema_version")
	str(CurrentSchemaVersion)
	str(payloadKey)
	var body []byte
	switch v := payload.(type) {
	case msgpack.RawMessage: // an encoded value, written as it is
		body = v
	case []byte: // compressed: a bin
		if err == nil {
			err = e.EncodeBytesLen(len(v))
		}
		body = v
	}
	if err != nil {
		return nil, fmt.Errorf("events: encode %s: %w", ev.Kind(), err)
	}
	dst = append(append(grown(dst, p.buf.Len()+len(body)+64), p.buf.Bytes()...), body...)
	p.buf.Reset()
	if refs != nil {
		str("refs")
		if err == nil {
			err = e.Encode(refs)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("events: encode %s: %w", ev.Kind(), err)
	}
	p.buf.Write(crcTrailer)
	return append(dst, p.buf.Bytes()...), nil
}

// grown is b with room for n more bytes. It is slices.Grow, but allocates
// with make and copies only b: the compiler builds slices.Grow's
// append(b, make(n)...) as a copy of n zeroes when it instruments for the
// race detector, which for a 64 MiB payload under test was a quarter of
// encoding it (shadow memory for the zeroes read and written).
func grown(b []byte, n int) []byte {
	if cap(b)-len(b) >= n {
		return b
	}
	g := make([]byte, len(b), len(b)+n)
	copy(g, b)
	return g
}

// encodePayload encodes ev's payload, compressed when that pays, and with
// references in place of what can be derived (refs.go) when the result is
// compressed; otherwise without any.
func (p *pooledEncoder) encodePayload(ev Event, lastReply *string) (key string, payload any, refs *stepRefs, err error) {
	deduped, refs := withRefs(ev, lastReply)
	// Every text textBytes counts is encoded whole, so texts over the bound
	// are refused before the encoder copies them (100 MiB of reply, once).
	if n := textBytes(deduped); n > MaxPayload {
		return "", nil, nil, fmt.Errorf("%w: its texts alone are %d bytes, more than events.MaxPayload (%d)", ErrTooLarge, n, MaxPayload)
	}
	for {
		p.payloadBuf.Reset()
		if n := textBytes(deduped) + 4096; n > 1<<20 && p.payloadBuf.Cap() < n {
			// One allocation at size, not a doubling buffer's trail of
			// garbage as large as the payload.
			*p.payloadBuf = *bytes.NewBuffer(grown(nil, n))
		}
		if err := p.payload.Encode(deduped); err != nil {
			return "", nil, nil, err
		}
		raw := p.payloadBuf.Bytes()
		if len(raw) > MaxPayload {
			return "", nil, nil, fmt.Errorf("%w: its payload is %d bytes, more than events.MaxPayload (%d)", ErrTooLarge, len(raw), MaxPayload)
		}
		// An event large enough to compress keeps its references however
		// small they leave its payload (a reader takes them only beside a
		// compressed one): a final answer's step would otherwise store the
		// reply again, and a reader decode it again.
		withRefs := refs != nil && textBytes(ev) >= compressMin
		if len(raw) >= compressMin || withRefs {
			p.z = s2.Encode(p.z[:cap(p.z)], raw)
			if z := p.z; withRefs || len(z) <= len(raw)-len(raw)/8 {
				return "payload_s2", z, refs, nil
			}
		}
		if refs == nil {
			return "payload", msgpack.RawMessage(raw), nil, nil
		}
		deduped, refs = ev, nil // refs only beside a compressed payload
	}
}

// textBytes is the size of ev's texts, the bulk of its payload when it is
// large: a size hint for the encoder, and a lower bound of the payload's
// size (each text it counts is encoded whole).
func textBytes(ev Event) int {
	n := 0
	str := func(s *string) {
		if s != nil {
			n += len(*s)
		}
	}
	if e, ok := As[RunStarted](ev); ok {
		for k, v := range e.ParameterSnapshot {
			n += len(k) + len(v)
		}
	}
	if e, ok := As[ModelCallResult](ev); ok {
		if e.Reply != nil {
			n += len(e.Reply.Content) + len(e.Reply.Thinking)
		}
		str(e.Failure)
	}
	if e, ok := As[StepCompleted](ev); ok {
		n += len(e.Step.RawOutput) + len(e.Step.Observation)
		str(e.Step.Action)
		str(e.Step.ParseError)
		str(e.Step.ToolArguments)
		if o := e.ActionOutcome; o != nil {
			n += len(o.Observation)
		}
	}
	if e, ok := As[RunFinished](ev); ok {
		str(e.Result.FinalAnswer)
	}
	return n
}

// Unmarshal decodes a stored value written under key id in runID's stream,
// verifying its checksum. Every failure is a *DecodeError; it never panics
// on arbitrary bytes. A value of schema 1.0, from before the checksum, is
// read without one.
func Unmarshal(runID string, id ulid.ULID, b []byte) (env Envelope, err error) {
	return unmarshal(runID, id, b, nil)
}

// unmarshal is Unmarshal; reply, when the caller decodes the run's stream
// in order (StreamReader), is its latest reply before this value, for
// references to it.
func unmarshal(runID string, id ulid.ULID, b []byte, reply *streamReply) (env Envelope, err error) {
	fail := func(kind Kind, sentinel error, detail string) (Envelope, error) {
		return Envelope{}, &DecodeError{ID: id, Kind: kind, Err: sentinel, Detail: detail}
	}
	if err := WellFormed(b); err != nil {
		return fail("", ErrMalformed, err.Error())
	}
	var w wireEnvelope
	if err := decodeWalked(b, &w); err != nil {
		return fail("", ErrMalformed, err.Error())
	}
	if w.Payload == nil && w.Kind == "" && w.SchemaVersion == nil {
		return fail("", ErrMalformed, "no envelope fields")
	}
	kind := Kind(w.Kind)
	if w.SchemaVersion == nil || *w.SchemaVersion == "" {
		return fail(kind, ErrMissingVersion, "")
	}
	major, err := majorOf(*w.SchemaVersion)
	if err != nil {
		return fail(kind, ErrUnknownMajor, err.Error())
	}
	if major != currentMajor {
		return fail(kind, ErrUnknownMajor, fmt.Sprintf("version %q, this codec reads major %d", *w.SchemaVersion, currentMajor))
	}
	switch {
	case w.CRC != nil:
		// Marshal puts the checksum last; a value whose checksum field is
		// anywhere else was not written by it.
		if !endsWithChecksum(b) || binary.BigEndian.Uint32(b[len(b)-4:]) != *w.CRC {
			return fail(kind, ErrChecksum, "the checksum is not the value's last field")
		}
		if got := checksum(runID, id, b[:len(b)-4]); got != *w.CRC {
			return fail(kind, ErrChecksum, fmt.Sprintf("stored %08x, computed %08x for run %q", *w.CRC, got, runID))
		}
	case *w.SchemaVersion != "1.0":
		return fail(kind, ErrChecksum, fmt.Sprintf("a value of schema %s carries no checksum", *w.SchemaVersion))
	}
	if n := countNonNil(w.Payload, w.PayloadZ, w.PayloadS2); n > 1 {
		return fail(kind, ErrMalformed, "more than one of payload, payload_z and payload_s2")
	}
	if w.PayloadZ != nil || w.PayloadS2 != nil {
		key, raw, err := "payload_z", []byte(nil), error(nil)
		if w.PayloadZ != nil {
			raw, err = zDecoder.DecodeAll(w.PayloadZ, nil)
		} else {
			key = "payload_s2"
			raw, err = decodeS2(w.PayloadS2)
			defer decoded.Put(&raw)
		}
		if err != nil {
			return fail(kind, ErrMalformed, key+" does not decompress: "+err.Error())
		}
		if len(raw) > MaxPayload {
			return fail(kind, ErrMalformed, fmt.Sprintf("%s decompresses to %d bytes, more than %d", key, len(raw), MaxPayload))
		}
		if err := WellFormed(raw); err != nil {
			return fail(kind, ErrMalformed, key+": "+err.Error())
		}
		w.Payload = raw
	}
	ev, err := decodePayload(kind, msgpack.RawMessage(w.Payload), w.Refs == nil)
	if err != nil {
		if errors.Is(err, ErrUnknownKind) {
			return fail(kind, ErrUnknownKind, fmt.Sprintf("%q", w.Kind))
		}
		return fail(kind, ErrPayloadMismatch, err.Error())
	}
	if w.Refs != nil {
		if w.PayloadS2 == nil {
			return fail(kind, ErrMalformed, "refs beside a payload that is not compressed")
		}
		if ev, err = w.Refs.resolve(ev, reply); err != nil {
			if errors.Is(err, ErrNeedsStream) {
				return fail(kind, ErrNeedsStream, "step.raw_output is the latest model reply before it")
			}
			return fail(kind, ErrMalformed, "refs: "+err.Error())
		}
		if err := ev.Validate(); err != nil {
			return fail(kind, ErrPayloadMismatch, err.Error())
		}
	}
	return Envelope{ID: id, Kind: kind, SchemaVersion: *w.SchemaVersion, Event: ev}, nil
}

func countNonNil(bs ...[]byte) int {
	n := 0
	for _, b := range bs {
		if b != nil {
			n++
		}
	}
	return n
}

// decodeS2 decompresses an S2 block, refusing one that declares more than
// MaxPayload bytes before allocating for it.
func decodeS2(z []byte) ([]byte, error) {
	n, err := s2.DecodedLen(z)
	if err != nil {
		return nil, err
	}
	if n > MaxPayload {
		return nil, fmt.Errorf("it declares %d bytes, more than %d", n, MaxPayload)
	}
	buf := *decoded.Get().(*[]byte)
	return s2.Decode(buf[:cap(buf)], z)
}

// decoded holds buffers for decompressed payloads, handed back once the
// payload is decoded: no record keeps a reference into its payload's bytes
// (their strings are copies), and reading a stream of large values then
// decompresses each into the same memory.
var decoded = sync.Pool{New: func() any { return new([]byte) }}

// MaxItems bounds the entries of any map and the elements of any array in
// a stored value (the only one records hold in number is a run's parameter
// snapshot): a decoder allocates for a declared count before reading the
// items, and a Go map entry or struct costs far more than the byte each
// item needs at least, so a damaged or forged value claiming millions of
// them is refused by WellFormed before any decoder sees it. Validate holds
// writers to it.
const MaxItems = 1 << 14

// maxNesting bounds how deep stored values nest: records are a few levels
// deep, and a damaged value claiming more is refused before any decoder
// recurses into it.
const maxNesting = 32

// WellFormed walks b as exactly one msgpack value without building it and
// without recursion: a stack of counts stands in for the nesting. It
// proves every declared length is backed by bytes and no array or map
// holds more than MaxItems (so a damaged value cannot make decoding
// allocate far beyond its own size) and that nothing nests deeper than 32
// levels (so decoding cannot exhaust the stack).
// Unmarshal runs it first; a store decoding msgpack values of its own (an
// index entry) should too.
func WellFormed(b []byte) error {
	end, err := walk(b, 0)
	if err != nil {
		return err
	}
	if end < len(b) {
		return fmt.Errorf("%d bytes after the envelope", len(b)-end)
	}
	return nil
}

// walk walks the one msgpack value that starts at b[i], as WellFormed
// describes, and returns the index just past it.
func walk(b []byte, i int) (int, error) {
	pending := make([]uint64, 1, 8) // values still to read, per level
	pending[0] = 1
	for len(pending) > 0 {
		top := len(pending) - 1
		if pending[top] == 0 {
			pending = pending[:top]
			continue
		}
		pending[top]--
		if i >= len(b) {
			return 0, errors.New("the value ends early")
		}
		c := b[i]
		i++
		// width: bytes of a length field; skip: bytes to pass; items:
		// nested values that follow.
		var width int
		var skip, items uint64
		switch {
		case c <= 0x7f || c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3: // fixint, nil, bool
		case c <= 0x8f:
			items = 2 * uint64(c&0x0f)
		case c <= 0x9f:
			items = uint64(c & 0x0f)
		case c <= 0xbf:
			skip = uint64(c & 0x1f)
		case c == 0xc1:
			return 0, errors.New("reserved byte 0xc1")
		case c <= 0xc6: // bin 8/16/32
			width = 1 << (c - 0xc4)
		case c <= 0xc9: // ext 8/16/32: length, then a type byte
			width, skip = 1<<(c-0xc7), 1
		case c <= 0xcb: // float 32/64
			skip = 4 << (c - 0xca)
		case c <= 0xd3: // uint, int 8..64
			skip = 1 << ((c - 0xcc) % 4)
		case c <= 0xd8: // fixext 1..16 and a type byte
			skip = 1 + 1<<(c-0xd4)
		case c <= 0xdb: // str 8/16/32
			width = 1 << (c - 0xd9)
		case c <= 0xdd: // array 16/32
			width = 2 << (c - 0xdc)
		default: // map 16/32
			width = 2 << (c - 0xde)
		}
		if width > 0 {
			if len(b)-i < width {
				return 0, errors.New("the value ends inside a length")
			}
			var n uint64
			for _, x := range b[i : i+width] {
				n = n<<8 | uint64(x)
			}
			i += width
			switch {
			case c >= 0xdc && n > MaxItems:
				return 0, fmt.Errorf("an array or map of %d items, more than %d", n, MaxItems)
			case c >= 0xdc && c <= 0xdd:
				items = n
			case c >= 0xde:
				items = 2 * n
			default:
				skip += n
			}
		}
		if skip > uint64(len(b)-i) {
			return 0, fmt.Errorf("a length of %d bytes runs past the value's end", skip)
		}
		i += int(skip)
		if items > 0 {
			if items > uint64(len(b)-i) {
				return 0, fmt.Errorf("%d nested values cannot fit in the %d bytes left", items, len(b)-i)
			}
			if len(pending) >= maxNesting {
				return 0, fmt.Errorf("values nest deeper than %d levels", maxNesting)
			}
			pending = append(pending, items)
		}
	}
	return i, nil
}

// checkVersion refuses a nested schema version that is missing or of a
// major this codec does not read.
func checkVersion(field, v string) error {
	if v == "" {
		return fmt.Errorf("%s is missing", field)
	}
	major, err := majorOf(v)
	if err != nil {
		return fmt.Errorf("%s: %w", field, err)
	}
	if major != currentMajor {
		return fmt.Errorf("%s %q is of a major this codec does not read (%d)", field, v, currentMajor)
	}
	return nil
}

func majorOf(v string) (int, error) {
	head, _, _ := strings.Cut(v, ".")
	n, err := strconv.Atoi(head)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("version %q is not major.minor", v)
	}
	return n, nil
}

func decodePayload(kind Kind, raw msgpack.RawMessage, validate bool) (Event, error) {
	if len(raw) == 0 || (len(raw) == 1 && raw[0] == 0xc0) {
		if !kindKnown(kind) {
			return nil, ErrUnknownKind
		}
		return nil, errors.New("payload is missing")
	}
	var (
		ev  Event
		err error
	)
	switch kind {
	case KindRunStarted:
		ev, err = decodeAs[RunStarted](raw)
	case KindIntent:
		ev, err = decodeAs[Intent](raw)
	case KindModelCallResult:
		ev, err = decodeAs[ModelCallResult](raw)
	case KindStepCompleted:
		ev, err = decodeAs[StepCompleted](raw)
	case KindRunFinished:
		ev, err = decodeAs[RunFinished](raw)
	case KindDecision:
		ev, err = decodeAs[Decision](raw)
	default:
		return nil, ErrUnknownKind
	}
	if err != nil {
		return nil, err
	}
	if !validate {
		return ev, nil // validated once its references are filled in
	}
	if err := ev.Validate(); err != nil {
		return nil, err
	}
	return ev, nil
}

func kindKnown(k Kind) bool {
	switch k {
	case KindRunStarted, KindIntent, KindModelCallResult, KindStepCompleted, KindRunFinished, KindDecision:
		return true
	}
	return false
}

func decodeAs[T Event](raw msgpack.RawMessage) (Event, error) {
	var v T
	if err := decodeWalked(raw, &v); err != nil {
		return nil, err
	}
	return v, nil
}

// decodeWalked is msgpack.Unmarshal for bytes WellFormed has walked. Its
// bounds on every declared length and count let the decoder allocate a
// string at its size at once, where msgpack's default grows it 1 MiB at a
// time against a length it cannot trust (six times the string's size
// allocated for a 60 MiB reply). (msgpack.Unmarshal's preallocation of
// pointer values is not asked for: it keeps goroutines of its own.)
// Fields of the in-place types below are taken as sub-slices of b, valid
// as long as b is.
//
// A value over 1 MiB is decoded by a decoder of its own, dropped after:
// a pooled decoder keeps the buffer it read the largest string into, so
// one 64 MiB reply left 64 MiB in the pool, and a pooled buffer too small
// for a large string is grown by appending zeroes, which the race
// detector's instrumentation copies.
func decodeWalked(b []byte, v any) error {
	r := walkedReader{b: b}
	if len(b) > 1<<20 {
		dec := msgpack.NewDecoder(&r)
		dec.DisableAllocLimit(true)
		return dec.Decode(v)
	}
	dec := msgpack.GetDecoder()
	dec.Reset(&r)
	dec.DisableAllocLimit(true)
	err := dec.Decode(v)
	msgpack.PutDecoder(dec)
	return err
}

// walkedReader reads a value WellFormed has walked, for decodeWalked. It
// is an io.ByteScanner, so the decoder reads it directly, unbuffered: the
// decoder's place in the value is r.i, and an in-place field can take its
// bytes from there.
type walkedReader struct {
	b []byte
	i int
}

func (r *walkedReader) Read(p []byte) (int, error) {
	if r.i >= len(r.b) {
		return 0, io.EOF
	}
	n := copy(p, r.b[r.i:])
	r.i += n
	return n, nil
}

func (r *walkedReader) ReadByte() (byte, error) {
	if r.i >= len(r.b) {
		return 0, io.EOF
	}
	r.i++
	return r.b[r.i-1], nil
}

func (r *walkedReader) UnreadByte() error {
	if r.i == 0 {
		return errors.New("events: unread at the start of a value")
	}
	r.i--
	return nil
}

// rawInPlace is msgpack.RawMessage without the copy: decoded from a
// walkedReader it is the sub-slice of the value that holds the field's
// encoded value. msgpack.RawMessage records a value by reading it through
// the decoder's buffer and appending it to a new slice: for a 64 MiB
// payload, two copies and two buffers of its size before it was decoded.
type rawInPlace []byte

func (v *rawInPlace) DecodeMsgpack(d *msgpack.Decoder) error {
	r, ok := d.Buffered().(*walkedReader)
	if !ok {
		raw, err := d.DecodeRaw()
		*v = rawInPlace(raw)
		return err
	}
	end, err := walk(r.b, r.i)
	if err != nil {
		return err
	}
	*v, r.i = rawInPlace(r.b[r.i:end:end]), end
	return nil
}

// binInPlace is []byte without the copy: decoded from a walkedReader, a
// bin or str field's content is the sub-slice of the value that holds it.
// A field of another type is left to msgpack, whose error names it.
type binInPlace []byte

func (v *binInPlace) DecodeMsgpack(d *msgpack.Decoder) error {
	if r, ok := d.Buffered().(*walkedReader); ok {
		if start, end, ok := bytesAt(r.b, r.i); ok {
			*v, r.i = binInPlace(r.b[start:end:end]), end
			return nil
		}
	}
	b, err := d.DecodeBytes()
	*v = binInPlace(b)
	return err
}

// bytesAt is where the content of the str or bin value at b[i] starts and
// ends; ok is false for a value of another type or one b does not hold.
func bytesAt(b []byte, i int) (start, end int, ok bool) {
	if i >= len(b) {
		return 0, 0, false
	}
	c := b[i]
	var width int
	switch {
	case c >= 0xa0 && c <= 0xbf: // fixstr
		start, end = i+1, i+1+int(c&0x1f)
		return start, end, end <= len(b)
	case c >= 0xc4 && c <= 0xc6: // bin 8/16/32
		width = 1 << (c - 0xc4)
	case c >= 0xd9 && c <= 0xdb: // str 8/16/32
		width = 1 << (c - 0xd9)
	default:
		return 0, 0, false
	}
	if len(b)-(i+1) < width {
		return 0, 0, false
	}
	n := 0
	for _, x := range b[i+1 : i+1+width] {
		n = n<<8 | int(x)
	}
	start = i + 1 + width
	if n > len(b)-start {
		return 0, 0, false
	}
	return start, start + n, true
}
