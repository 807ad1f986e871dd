package cliflags_test

import (
	"errors"
	"flag"
	"io"
	"reflect"
	"testing"
	"time"

	"github.com/polyloop/polyloop/cmd/internal/cliflags"
)

// TestFlagsStandAnywhere: flags before, between and after positional
// arguments; a value flag takes the next argument unless written with =;
// a bool flag never does; after "--" every argument is positional; -h is
// flag.ErrHelp.
func TestFlagsStandAnywhere(t *testing.T) {
	for _, c := range []struct {
		args  []string
		pos   []string
		force bool
		age   time.Duration
	}{
		{[]string{"store", "run"}, []string{"store", "run"}, false, 0},
		{[]string{"--force", "store", "run"}, []string{"store", "run"}, true, 0},
		{[]string{"store", "--force", "run"}, []string{"store", "run"}, true, 0},
		{[]string{"store", "--age", "5m", "run"}, []string{"store", "run"}, false, 5 * time.Minute},
		{[]string{"--age=1h", "store"}, []string{"store"}, false, time.Hour},
		{[]string{"-", "--force"}, []string{"-"}, true, 0},
		{[]string{"--force", "store", "--", "-run", "--age"}, []string{"store", "-run", "--age"}, true, 0},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		force := fs.Bool("force", false, "")
		age := fs.Duration("age", 0, "")
		pos, err := cliflags.Parse(fs, c.args)
		if err != nil || !reflect.DeepEqual(pos, c.pos) || *force != c.force || *age != c.age {
			t.Errorf("%q: positional %q, force %t, age %v (%v)", c.args, pos, *force, *age, err)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if _, err := cliflags.Parse(fs, []string{"store", "-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}
