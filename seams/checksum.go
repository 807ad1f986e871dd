package seams

import (
	"encoding/binary"
	"hash/crc32"
	"sync"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// checksumBufs are the buffers Checksum lays entries out in: a buffer
// handed to the CRC routine escapes, so one on the stack would be
// allocated anew at every call, and the committing kv leader sums an entry
// with every append.
var checksumBufs = sync.Pool{New: func() any { return new([256]byte) }}

// Checksum is the CRC-32C (Castagnoli) of the entry as filed under key:
// the key's length and bytes, then every field in a fixed order — run id,
// status and stop reason as length-prefixed strings; steps, events, and
// the first and last event times in Unix nanoseconds as varints; the last
// key's 16 bytes. A store keeps it beside the entry (kv in its index
// entry, pgstore in the runs row) and reports an entry that no longer sums
// to it as damage instead of trusting it.
func (r *RunInfo) Checksum(key []byte) uint32 {
	buf := checksumBufs.Get().(*[256]byte) // an entry fits in practice
	defer checksumBufs.Put(buf)
	b := binary.AppendUvarint(buf[:0], uint64(len(key)))
	b = append(b, key...)
	for _, s := range []string{r.RunID, string(r.Status), string(r.StopReason)} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	for _, n := range []int64{int64(r.Steps), int64(r.Events), r.FirstEvent.UnixNano(), r.LastEvent.UnixNano()} {
		b = binary.AppendVarint(b, n)
	}
	b = append(b, r.LastID[:]...)
	return crc32.Checksum(b, castagnoli)
}
