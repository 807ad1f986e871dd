package viewer_test

import (
	"context"
	"net/http/httptest"
	"regexp"
	"slices"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams/seamstest"
	"github.com/polyloop/polyloop/viewer"
)

// TestTheStepsTableShowsWallTimeAndTokens: each step's wall-time bar is
// its share of the longest step's (100 for the longest), and its tokens
// cell is its reply's input plus output tokens, or "-" without usage.
func TestTheStepsTableShowsWallTimeAndTokens(t *testing.T) {
	evs := proptest.SoundStream("walls") // steps of 12, 0, 0 and 5 ms
	reply := evs[2].(events.ModelCallResult)
	in, out := int64(100), int64(20)
	r := *reply.Reply
	r.Usage = &events.Usage{InputTokens: &in, OutputTokens: &out}
	reply.Reply = &r
	evs[2] = reply
	store := &seamstest.MemStore{}
	if _, err := store.Append(context.Background(), "walls", ulid.ULID{}, evs...); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(viewer.New(store, viewer.Options{}))
	defer srv.Close()
	_, _, page := get(t, srv.URL+"/run?id=walls")
	cells := func(re string) []string {
		var out []string
		for _, m := range regexp.MustCompile(re).FindAllStringSubmatch(page, -1) {
			out = append(out, m[1])
		}
		return out
	}
	if got, want := cells(`<progress max="100" value="(\d+)">`), []string{"100", "0", "0", "41"}; !slices.Equal(got, want) {
		t.Errorf("wall-time bars %q, want %q (shares of the longest step's 12 ms)", got, want)
	}
	if got, want := cells(`<td>\d+</td><td>([^<]*)</td>\s*<td><progress`), []string{"120", "-", "-", "-"}; !slices.Equal(got, want) {
		t.Errorf("tokens cells %q, want %q", got, want)
	}
}
