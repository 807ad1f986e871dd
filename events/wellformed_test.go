package events_test

import (
	"bytes"
	"flag"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
	"pgregory.net/rapid"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/internal/soak"
)

// TestMain raises rapid's default to 300 generated cases, 2,000 under
// POLYLOOP_SOAK=1 (package soak): the walker has many format bytes to
// agree on.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "rapid.checks" })
	if !set {
		flag.Set("rapid.checks", strconv.Itoa(soak.Count(300, 2000)))
	}
	os.Exit(m.Run())
}

// msgpackValue draws a value whose encoding uses every msgpack format the
// walker must size: fixint and every int and uint width, floats, nil, bools,
// strings and binaries of every length class, arrays and maps of every
// length class, nested a few levels (ext values come from rawExt).
func msgpackValue(t *rapid.T, depth int) any {
	kinds := []string{"int", "uint", "float32", "float64", "nil", "bool", "str", "bin"}
	if depth < 4 {
		kinds = append(kinds, "array", "map")
	}
	switch rapid.SampledFrom(kinds).Draw(t, "kind") {
	case "int":
		return rapid.Int64().Draw(t, "i")
	case "uint":
		return rapid.Uint64().Draw(t, "u")
	case "float32":
		return rapid.Float32().Draw(t, "f32")
	case "float64":
		return rapid.Float64().Draw(t, "f64")
	case "nil":
		return nil
	case "bool":
		return rapid.Bool().Draw(t, "b")
	case "str":
		return strings.Repeat("s", rapid.SampledFrom([]int{0, 5, 31, 32, 255, 256, 65535, 65536}).Draw(t, "str_len"))
	case "bin":
		return bytes.Repeat([]byte{7}, rapid.SampledFrom([]int{0, 5, 255, 256, 65535, 65536}).Draw(t, "bin_len"))
	case "array":
		n := rapid.SampledFrom([]int{0, 1, 3, 15, 16, 20}).Draw(t, "array_len")
		out := make([]any, n)
		for i := range out {
			out[i] = msgpackValue(t, depth+1)
		}
		return out
	}
	n := rapid.SampledFrom([]int{0, 1, 3, 15, 16, 20}).Draw(t, "map_len")
	out := map[string]any{}
	for i := range n {
		out[strings.Repeat("k", i+1)] = msgpackValue(t, depth+1)
	}
	return out
}

// rawExt is an ext value of each length class.
var rawExt = [][]byte{
	{0xd4, 1, 0}, {0xd5, 1, 0, 0}, {0xd6, 1, 0, 0, 0, 0}, {0xd7, 1, 0, 0, 0, 0, 0, 0, 0, 0},
	append([]byte{0xd8, 1}, make([]byte, 16)...), append([]byte{0xc7, 3, 1}, 1, 2, 3),
	append([]byte{0xc8, 0, 3, 1}, 1, 2, 3), append([]byte{0xc9, 0, 0, 0, 3, 1}, 1, 2, 3),
}

// skipAll is msgpack's own judgement: one value, walked to its end, and
// nothing after it.
func skipAll(b []byte) bool {
	r := bytes.NewReader(b)
	return msgpack.NewDecoder(r).Skip() == nil && r.Len() == 0
}

// TestPropertyWellFormedAgreesWithMsgpack: on encodings of every format,
// whole, cut short, with one byte changed or with bytes appended, the
// walker accepts exactly what msgpack's own decoder can skip to the end
// (values here nest at most 5 levels, inside the walker's bound).
func TestPropertyWellFormedAgreesWithMsgpack(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var b []byte
		if rapid.IntRange(0, 5).Draw(t, "ext") == 0 {
			b = append(b, rapid.SampledFrom(rawExt).Draw(t, "raw_ext")...)
		} else {
			enc, err := msgpack.Marshal(msgpackValue(t, 0))
			if err != nil {
				t.Fatal(err)
			}
			b = enc
		}
		switch rapid.SampledFrom([]string{"whole", "cut", "changed", "appended"}).Draw(t, "damage") {
		case "cut":
			b = b[:rapid.IntRange(0, len(b)).Draw(t, "cut_at")]
		case "changed":
			i := rapid.IntRange(0, len(b)-1).Draw(t, "at")
			b = bytes.Clone(b)
			b[i] = rapid.Byte().Draw(t, "to")
		case "appended":
			b = append(bytes.Clone(b), rapid.SliceOfN(rapid.Byte(), 1, 4).Draw(t, "extra")...)
		}
		if got, want := events.WellFormed(b) == nil, skipAll(b); got != want {
			t.Fatalf("WellFormed accepts=%t, msgpack skips=%t, for % x", got, want, b[:min(len(b), 64)])
		}
	})
}

// TestWellFormedAtItsBounds: values that use their bytes exactly, and
// nesting at the walker's limit and one past it.
func TestWellFormedAtItsBounds(t *testing.T) {
	nested := func(levels int) []byte {
		return append(bytes.Repeat([]byte{0x91}, levels), 0xc0) // [[[…nil…]]]
	}
	cases := []struct {
		name string
		b    []byte
		ok   bool
	}{
		{"an array whose items fill the value exactly", []byte{0x93, 1, 2, 3}, true},
		{"an array one item short", []byte{0x93, 1, 2}, false},
		{"a map whose entries fill the value exactly", []byte{0x81, 0xa1, 'k', 7}, true},
		{"31 arrays nested, the most the walker takes", nested(31), true},
		{"32 arrays nested", nested(32), false},
	}
	for _, c := range cases {
		if err := events.WellFormed(c.b); (err == nil) != c.ok {
			t.Errorf("%s: WellFormed = %v, want ok=%t", c.name, err, c.ok)
		}
	}
}
