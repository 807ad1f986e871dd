package events

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/vmihailenco/msgpack/v5"
)

// CurrentSchemaVersion is the codec's schema version, "major.minor". A reader
// accepts any minor of a major it knows and refuses other majors.
const CurrentSchemaVersion = "1.0"

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
	// ErrUnknownKind: the kind is not one of the five records.
	ErrUnknownKind = errors.New("events: unknown event kind")
	// ErrPayloadMismatch: the payload does not decode as, or is not a valid,
	// record of the envelope's kind.
	ErrPayloadMismatch = errors.New("events: payload does not match its kind")
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
	Kind          string             `msgpack:"kind"`
	SchemaVersion *string            `msgpack:"schema_version"`
	Payload       msgpack.RawMessage `msgpack:"payload"`
}

type encodeEnvelope struct {
	Kind          Kind   `msgpack:"kind"`
	SchemaVersion string `msgpack:"schema_version"`
	Payload       Event  `msgpack:"payload"`
}

var encoders = sync.Pool{New: func() any {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.SetSortMapKeys(true) // deterministic bytes for golden files
	return &pooledEncoder{buf: &buf, enc: enc}
}}

type pooledEncoder struct {
	buf *bytes.Buffer
	enc *msgpack.Encoder
}

// Marshal encodes ev as a stored value (kind, CurrentSchemaVersion, payload).
// It refuses an event that fails Validate, so nothing invalid is written.
func Marshal(ev Event) ([]byte, error) {
	if ev == nil {
		return nil, errors.New("events: marshal of a nil event")
	}
	if err := ev.Validate(); err != nil {
		return nil, fmt.Errorf("events: invalid %s: %w", ev.Kind(), err)
	}
	p := encoders.Get().(*pooledEncoder)
	defer encoders.Put(p)
	p.buf.Reset()
	if err := p.enc.Encode(encodeEnvelope{Kind: ev.Kind(), SchemaVersion: CurrentSchemaVersion, Payload: ev}); err != nil {
		return nil, fmt.Errorf("events: encode %s: %w", ev.Kind(), err)
	}
	return bytes.Clone(p.buf.Bytes()), nil
}

// Unmarshal decodes a stored value written under key id. Every failure is a
// *DecodeError; it never panics on arbitrary bytes.
func Unmarshal(id ulid.ULID, b []byte) (env Envelope, err error) {
	fail := func(kind Kind, sentinel error, detail string) (Envelope, error) {
		return Envelope{}, &DecodeError{ID: id, Kind: kind, Err: sentinel, Detail: detail}
	}
	if err := wellFormed(b); err != nil {
		return fail("", ErrMalformed, err.Error())
	}
	var w wireEnvelope
	if err := msgpack.Unmarshal(b, &w); err != nil {
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
	ev, err := decodePayload(kind, w.Payload)
	if err != nil {
		if errors.Is(err, ErrUnknownKind) {
			return fail(kind, ErrUnknownKind, fmt.Sprintf("%q", w.Kind))
		}
		return fail(kind, ErrPayloadMismatch, err.Error())
	}
	return Envelope{ID: id, Kind: kind, SchemaVersion: *w.SchemaVersion, Event: ev}, nil
}

// wellFormed walks b as exactly one msgpack value without building it. The
// decoder sizes maps and slices from their declared lengths (up to a
// million elements); walking first proves every declared length is backed
// by bytes, so a damaged value cannot make decoding allocate far beyond its
// own size.
func wellFormed(b []byte) error {
	r := bytes.NewReader(b)
	// A fresh decoder, not a pooled one: skipping a bogus length grows the
	// decoder's buffer by up to a megabyte, and a pooled decoder would keep
	// growing with every damaged value it met.
	d := msgpack.NewDecoder(r)
	if err := d.Skip(); err != nil {
		return err
	}
	if r.Len() > 0 {
		return fmt.Errorf("%d bytes after the envelope", r.Len())
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

func decodePayload(kind Kind, raw msgpack.RawMessage) (Event, error) {
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
	default:
		return nil, ErrUnknownKind
	}
	if err != nil {
		return nil, err
	}
	if err := ev.Validate(); err != nil {
		return nil, err
	}
	return ev, nil
}

func kindKnown(k Kind) bool {
	switch k {
	case KindRunStarted, KindIntent, KindModelCallResult, KindStepCompleted, KindRunFinished:
		return true
	}
	return false
}

func decodeAs[T Event](raw msgpack.RawMessage) (Event, error) {
	var v T
	if err := msgpack.Unmarshal(raw, &v); err != nil {
		return nil, err
	}
	return v, nil
}
