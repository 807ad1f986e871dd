package events

import (
	"errors"
	"fmt"
	"iter"
	"strings"

	"github.com/oklog/ulid/v2"
)

// ErrCorruption is the one corruption marker: every error PolyLoop returns
// for damage matches it with errors.Is, whichever layer found it — a
// stream's values that do not decode or fail their checksum and events
// missing (ErrDamaged, *DamageError), a store's file or index entry damaged
// (kv.ErrCorrupt, pgstore.ErrCorrupt), a log that breaks a structural rule
// (recovery.ErrCorrupt). So a caller asks "is this damage?" once, of any
// store: errors.Is(err, events.ErrCorruption). The specific sentinels say
// which layer found it; each matches itself and ErrCorruption.
var ErrCorruption = errors.New("events: corruption")

// NewCorruption returns a new sentinel error with text that matches
// ErrCorruption (and itself) with errors.Is: a package's own corruption
// sentinel, as kv.ErrCorrupt is.
func NewCorruption(text string) error { return &corruption{text} }

// corruption is a corruption sentinel of one layer.
type corruption struct{ text string }

func (e *corruption) Error() string { return e.text }

// Unwrap returns ErrCorruption.
func (e *corruption) Unwrap() error { return ErrCorruption }

// ErrDamaged: a stored stream holds values that do not decode or fail their
// checksum, or events the store's records say it holds are missing. It
// matches ErrCorruption.
var ErrDamaged = NewCorruption("events: stored stream is damaged")

// DamageError lists every problem a store found loading a run's stream.
// Stores return it (wrapped) from Load together with the events that did
// decode, in order, so recovery can list the damage beside what is
// structurally wrong with the rest; package recovery turns it into a
// *recovery.CorruptError.
type DamageError struct {
	RunID string
	// Problems are *DecodeError values (naming the key and what failed)
	// and the store's own findings (events missing, keys that are not
	// ULIDs).
	Problems []error
}

func (e *DamageError) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = p.Error()
	}
	noun := "problems"
	if len(e.Problems) == 1 {
		noun = "problem"
	}
	return fmt.Sprintf("events: stored stream of run %q is damaged (%d %s):\n  %s", e.RunID, len(e.Problems), noun, strings.Join(lines, "\n  "))
}

// Unwrap returns ErrDamaged.
func (e *DamageError) Unwrap() error { return ErrDamaged }

// StreamReader decodes a run's stored values in key order, as a store's
// Load does, and collects every problem instead of stopping at the first.
// The zero value with RunID set is ready.
type StreamReader struct {
	RunID string
	// Each, when set, receives every event that decodes, in order, and the
	// reader keeps none of them (a store's Scan); an error it returns stops
	// the reader (Stopped) and is what Stream returns.
	Each func(Envelope) error
	// Earlier, for a reader handed a stream from its middle (a store's
	// LoadAfter), yields the values before the first one it is handed,
	// newest first; a nil value is one the store could not read. The
	// reader asks for them only when a value refers to the stream's latest
	// reply before it (references, refs.go), and reads back only as far
	// as that reply. Nil: the reader is handed the stream from its start.
	Earlier iter.Seq2[ulid.ULID, []byte]
	// Tee, when set, is handed what the reader is handed, in order, before
	// the reader acts on it: each value (Value: earlier false), each value
	// read back through Earlier (earlier true; nil for one the store could
	// not read), and each problem a store reports (Problem: value nil,
	// problem set). A store serving its reads to another process forwards
	// them, and a StreamReader there handed the same reports what this one
	// does.
	Tee  func(id ulid.ULID, value []byte, earlier bool, problem error)
	envs []Envelope
	bad  []error
	stop error
	// reply is what the stream holds as its latest reply so far, for
	// values that refer to it; with Earlier set, it is known once a reply
	// or a problem has been read, or Earlier has been.
	reply      streamReply
	replyKnown bool
}

// streamReply is a stream's latest model reply as read so far: its content
// (nil: none yet, or the latest call failed), or lost once a value did not
// decode or the store found events missing — the latest reply may then be
// one that was not read, and a reference to it must not resolve to an
// earlier one.
type streamReply struct {
	content *string
	lost    bool
}

// Value decodes the value stored under id (Unmarshal, checksum included)
// and returns the event, or false when it was a problem.
func (r *StreamReader) Value(id ulid.ULID, b []byte) (Envelope, bool) {
	if r.stop != nil {
		return Envelope{}, false
	}
	reply := &r.reply
	if r.Earlier != nil && !r.replyKnown {
		reply = nil // not known yet: a value that needs it says so
	}
	if r.Tee != nil {
		r.Tee(id, b, false, nil)
	}
	env, err := unmarshal(r.RunID, id, b, reply)
	if reply == nil && errors.Is(err, ErrNeedsStream) {
		r.readEarlier()
		env, err = unmarshal(r.RunID, id, b, &r.reply)
	}
	if err != nil {
		r.problem(err)
		return Envelope{}, false
	}
	if content, changed := ReplyAfter(env.Event); changed {
		r.reply, r.replyKnown = streamReply{content: content}, true
	}
	if r.Each != nil {
		r.stop = r.Each(env)
		return env, r.stop == nil
	}
	r.envs = append(r.envs, env)
	return env, true
}

// Stopped reports whether Each stopped the reader: the store need read no
// further.
func (r *StreamReader) Stopped() bool { return r.stop != nil }

// Problem records a problem the store found itself (an event missing, a
// key that is not a ULID).
func (r *StreamReader) Problem(err error) {
	if r.Tee != nil {
		r.Tee(ulid.ULID{}, nil, false, err)
	}
	r.problem(err)
}

// problem records a problem the reader found (a value that does not
// decode), or a store's.
func (r *StreamReader) problem(err error) {
	r.bad = append(r.bad, err)
	r.reply, r.replyKnown = streamReply{lost: true}, true
}

// readEarlier reads back through Earlier to the stream's latest reply
// before the first value the reader was handed: none when Earlier ends
// first, lost (a problem) when a value on the way does not decode.
func (r *StreamReader) readEarlier() {
	r.replyKnown = true
	for id, b := range r.Earlier {
		if r.Tee != nil {
			r.Tee(id, b, true, nil)
		}
		if b == nil {
			r.problem(fmt.Errorf("event %s, before those read, cannot be read", id))
			return
		}
		env, err := unmarshal(r.RunID, id, b, nil)
		switch {
		case errors.Is(err, ErrNeedsStream):
			continue // a step referring further back: not a reply
		case err != nil:
			r.problem(err)
			return
		}
		if content, changed := ReplyAfter(env.Event); changed {
			r.reply = streamReply{content: content}
			return
		}
	}
}

// Stream returns the events that decoded, in order, and a *DamageError
// listing every problem, or nil when there was none.
func (r *StreamReader) Stream() ([]Envelope, error) {
	if r.stop != nil {
		return nil, r.stop
	}
	if len(r.bad) == 0 {
		return r.envs, nil
	}
	return r.envs, &DamageError{RunID: r.RunID, Problems: r.bad}
}
