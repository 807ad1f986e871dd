package seams_test

import (
	"testing"

	"github.com/polyloop/polyloop/seams"
)

// otherBlock is a content block that is not text, as other media would be.
type otherBlock struct{ seams.ContentBlock }

// TestMessageTextJoinsItsTextBlocks: Text is a message's text as a model
// client sends it, its text blocks joined in order, other blocks skipped.
func TestMessageTextJoinsItsTextBlocks(t *testing.T) {
	for _, c := range []struct {
		name string
		msg  seams.Message
		want string
	}{
		{"one block", seams.Text(seams.RoleUser, "What is 2 + 40?"), "What is 2 + 40?"},
		{"no blocks", seams.Message{Role: seams.RoleAssistant}, ""},
		{"blocks in order", seams.Message{Role: seams.RoleUser, Content: []seams.ContentBlock{
			seams.TextBlock{Text: "first, "}, otherBlock{}, seams.TextBlock{Text: "then"}}}, "first, then"},
	} {
		if got := c.msg.Text(); got != c.want {
			t.Errorf("%s: Text() = %q, want %q", c.name, got, c.want)
		}
	}
}
