package kv

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/vmihailenco/msgpack/v5"
	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// Status and RunInfo are the seams' types, under their kv names.
type (
	Status  = seams.RunStatus
	RunInfo = seams.RunInfo
)

// Index statuses (see seams.RunStatus).
const (
	StatusRunning  = seams.StatusRunning
	StatusFinished = seams.StatusFinished
	StatusCorrupt  = seams.StatusCorrupt
)

// entry is a RunInfo under the names kv stores its fields by: RunInfo's
// fields, in its order, so each converts to the other (a field added to
// RunInfo does not compile here until it has a stored name).
type entry struct {
	RunID      string            `msgpack:"run_id"`
	Status     Status            `msgpack:"status"`
	Steps      int               `msgpack:"steps"`
	Events     int               `msgpack:"events"`
	StopReason events.StopReason `msgpack:"stop_reason"`
	FirstEvent time.Time         `msgpack:"first_event"`
	LastEvent  time.Time         `msgpack:"last_event"`
	LastID     ulid.ULID         `msgpack:"last_id"` // zero in entries written before the store kept it
}

// storedEntry is what the index stores of info: its data, not the
// coordination a listing adds (agent, holder, queue).
func storedEntry(info RunInfo) entry {
	return entry{RunID: info.RunID, Status: info.Status, Steps: info.Steps, Events: info.Events, StopReason: info.StopReason,
		FirstEvent: info.FirstEvent, LastEvent: info.LastEvent, LastID: info.LastID}
}

// info is the entry as a RunInfo.
func (e entry) info() RunInfo {
	return RunInfo{RunID: e.RunID, Status: e.Status, Steps: e.Steps, Events: e.Events, StopReason: e.StopReason,
		FirstEvent: e.FirstEvent, LastEvent: e.LastEvent, LastID: e.LastID}
}

// storedInfo is an index entry as stored: the RunInfo and its CRC-32C
// (seams.RunInfo.Checksum: its fields and the key it is filed under;
// absent in entries written before the store kept one).
type storedInfo struct {
	entry `msgpack:",inline"`
	CRC   *uint32 `msgpack:"crc"`
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// readInfo reads runID's index entry, filed under key (the layout's
// entryKey; nil: none on record): ok false when there is none, an
// ErrCorrupt error when it does not decode, fails its checksum or names
// another run.
func readInfo(index *bolt.Bucket, key []byte, runID string) (info RunInfo, ok bool, err error) {
	if key == nil {
		return RunInfo{}, false, nil
	}
	v := index.Get(key)
	if v == nil {
		return RunInfo{}, false, nil
	}
	info, err = decodeInfo(key, v, runID)
	return info, true, err
}

// maxInfoSize bounds an index entry: a few hundred bytes in practice.
const maxInfoSize = 64 << 10

// decodeInfo decodes the entry v filed under key, which must name runID.
func decodeInfo(key, v []byte, runID string) (RunInfo, error) {
	if len(v) > maxInfoSize {
		return RunInfo{}, fmt.Errorf("%w: index entry of run %q is %d bytes, more than an entry can be", ErrCorrupt, runID, len(v))
	}
	if err := events.WellFormed(v); err != nil {
		return RunInfo{}, fmt.Errorf("%w: index entry of run %q is not a msgpack value: %v", ErrCorrupt, runID, err)
	}
	var st storedInfo
	if err := msgpack.Unmarshal(v, &st); err != nil {
		return RunInfo{}, fmt.Errorf("%w: index entry of run %q does not decode: %v", ErrCorrupt, runID, err)
	}
	info := st.entry.info()
	if st.CRC != nil && *st.CRC != info.Checksum(key) {
		return RunInfo{}, fmt.Errorf("%w: index entry of run %q fails its checksum", ErrCorrupt, runID)
	}
	if st.RunID != runID {
		return RunInfo{}, fmt.Errorf("%w: index entry of run %q names run %q", ErrCorrupt, runID, st.RunID)
	}
	return info, nil
}

// writeInfo stores info, with its checksum, under key (the layout's
// entryKey), and returns the bytes stored.
func writeInfo(index *bolt.Bucket, key []byte, info RunInfo) ([]byte, error) {
	v, err := encodeInfo(key, info)
	if err != nil {
		return nil, err
	}
	return v, index.Put(key, v)
}

// encodeInfo is info as stored under key, with its checksum.
func encodeInfo(key []byte, info RunInfo) ([]byte, error) {
	sum := info.Checksum(key)
	st := storedInfo{entry: storedEntry(info), CRC: &sum}
	return st.appendMsgpack(make([]byte, 0, 160+len(info.RunID)+len(info.Status)+len(info.StopReason))), nil
}

// EncodeMsgpack writes the entry as appendMsgpack does.
func (st *storedInfo) EncodeMsgpack(e *msgpack.Encoder) error {
	_, err := e.Writer().Write(st.appendMsgpack(nil))
	return err
}

// appendMsgpack appends the entry's encoding to b, byte by byte: the bytes
// msgpack's reflection writes for the struct (TestTheEntryEncodingIsReflections
// holds the two together), without the reflection or an encoder. The
// committing leader encodes an entry with every append, inside the group's
// transaction.
func (st *storedInfo) appendMsgpack(b []byte) []byte {
	r := &st.entry
	b = append(b, 0x80|9) // a map of 9 fields
	b = mpString(mpString(b, "run_id"), r.RunID)
	b = mpString(mpString(b, "status"), string(r.Status))
	b = mpInt(mpString(b, "steps"), int64(r.Steps))
	b = mpInt(mpString(b, "events"), int64(r.Events))
	b = mpString(mpString(b, "stop_reason"), string(r.StopReason))
	b = mpTime(mpString(b, "first_event"), r.FirstEvent)
	b = mpTime(mpString(b, "last_event"), r.LastEvent)
	b = append(mpString(b, "last_id"), 0xc4, byte(len(r.LastID))) // bin 8
	b = append(b, r.LastID[:]...)
	b = mpString(b, "crc")
	if st.CRC == nil {
		return append(b, 0xc0) // nil
	}
	return binary.BigEndian.AppendUint32(append(b, 0xce), *st.CRC) // uint 32
}

// mpString appends s as msgpack's Encoder.EncodeString writes it.
func mpString(b []byte, s string) []byte {
	switch n := len(s); {
	case n < 32:
		b = append(b, 0xa0|byte(n)) // fixstr
	case n < 1<<8:
		b = append(b, 0xd9, byte(n)) // str 8
	case n < 1<<16:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n)) // str 16
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n)) // str 32
	}
	return append(b, s...)
}

// mpInt appends n as msgpack's Encoder.EncodeInt writes it: in the
// fewest bytes.
func mpInt(b []byte, n int64) []byte {
	if n >= 0 {
		switch u := uint64(n); {
		case u <= math.MaxInt8:
			return append(b, byte(u)) // positive fixint
		case u <= math.MaxUint8:
			return append(b, 0xcc, byte(u))
		case u <= math.MaxUint16:
			return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(u))
		case u <= math.MaxUint32:
			return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(u))
		default:
			return binary.BigEndian.AppendUint64(append(b, 0xcf), u)
		}
	}
	switch {
	case n >= -32:
		return append(b, byte(n)) // negative fixint
	case n >= math.MinInt8:
		return append(b, 0xd0, byte(n))
	case n >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(b, 0xd1), uint16(n))
	case n >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(n))
	default:
		return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(n))
	}
}

// mpTime appends t as msgpack's Encoder.EncodeTime writes it: the
// timestamp extension (type -1) in 4, 8 or 12 bytes.
func mpTime(b []byte, t time.Time) []byte {
	secs := uint64(t.Unix())
	if secs>>34 == 0 {
		data := uint64(t.Nanosecond())<<34 | secs
		if data&0xffffffff00000000 == 0 {
			return binary.BigEndian.AppendUint32(append(b, 0xd6, 0xff), uint32(data)) // fixext 4
		}
		return binary.BigEndian.AppendUint64(append(b, 0xd7, 0xff), data) // fixext 8
	}
	b = binary.BigEndian.AppendUint32(append(b, 0xc7, 12, 0xff), uint32(t.Nanosecond())) // ext 8
	return binary.BigEndian.AppendUint64(b, secs)
}
