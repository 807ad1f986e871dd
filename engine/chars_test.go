package engine

import (
	"testing"
	"unicode/utf8"

	"pgregory.net/rapid"
)

// TestCharsCountsAsRuneCountInString: the prompt and reply sizes the step
// records and budgets carry are code points, as utf8 counts them, invalid
// bytes included, whatever mix of ASCII runs and other bytes the text is.
func TestCharsCountsAsRuneCountInString(t *testing.T) {
	// A byte that is not ASCII at each place of a word, and runes across
	// a word's edge.
	for i := range 9 {
		for _, odd := range []string{"\x80", "\xff", "é", "€", "😀", "\xe2\x82"} {
			s := "abcdefghijklmnop"[:i] + odd + "abcdefghijklmnop"[i:]
			if got, want := chars(s), utf8.RuneCountInString(s); got != want {
				t.Fatalf("chars(%q) = %d, want %d", s, got, want)
			}
		}
	}
	rapid.Check(t, func(t *rapid.T) {
		var b []byte
		for _, part := range rapid.SliceOf(rapid.OneOf(
			rapid.StringMatching(`[ -~]{0,40}`).AsAny(),
			rapid.String().AsAny(),
			rapid.SliceOfN(rapid.Byte(), 0, 9).AsAny(),
		)).Draw(t, "parts") {
			switch p := part.(type) {
			case string:
				b = append(b, p...)
			case []byte:
				b = append(b, p...)
			}
		}
		s := string(b)
		if got, want := chars(s), utf8.RuneCountInString(s); got != want {
			t.Fatalf("chars(%q) = %d, want %d", s, got, want)
		}
	})
}
