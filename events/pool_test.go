package events

import (
	"encoding/hex"
	"math/rand/v2"
	"testing"
)

// TestALargeEventsBuffersAreNotPooled: after an event of megabytes, the
// encoders handed out again hold at most maxPooledBytes, so one large
// reply does not keep its buffers alive for every small event after it.
func TestALargeEventsBuffersAreNotPooled(t *testing.T) {
	b := make([]byte, 3<<19)
	rand.NewChaCha8([32]byte{}).Read(b)
	text := hex.EncodeToString(b) // 3 MiB, incompressible to S2
	for range 4 {
		if _, err := Marshal(ModelCallResult{RunID: "run-1", ResultID: "r", Reply: &ModelReply{Content: text}}); err != nil {
			t.Fatal(err)
		}
		p := encoders.Get().(*pooledEncoder)
		if n := p.buf.Cap() + p.payloadBuf.Cap() + cap(p.z); n > maxPooledBytes {
			t.Fatalf("an encoder from the pool holds %d bytes, more than %d", n, maxPooledBytes)
		}
		encoders.Put(p)
	}
}
