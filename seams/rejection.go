package seams

import (
	"fmt"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/polyloop/polyloop/events"
)

// A schema rejection is worded as the JSON Schema library words it, with
// a bound: the library quotes a failing value whole, once per schema branch
// it fails (8 MiB of arguments against an anyOf of three patterns made 144
// MiB of text, of which a run keeps events.MaxTextBytes), and lists every
// additional property, every failing or matching item, every token of a
// deeply nested location. Here each value and name taken from the arguments is cut to
// quotedLimit bytes, a list to listLimit names or indices, a location to
// its first and last locationEnds tokens, and the causes to causeLimit
// lines, each cut saying what it left out; a small rejection reads exactly
// as the library's.
const (
	quotedLimit  = 256
	listLimit    = 16
	causeLimit   = 64
	locationEnds = 8
)

var rejectionPrinter = message.NewPrinter(language.English)

// rejectionText is e.Error(), bounded (see quotedLimit).
func rejectionText(e *jsonschema.ValidationError) string {
	w := rejectionWriter{}
	w.write(e, 0)
	if w.left > 0 {
		fmt.Fprintf(&w.sb, "\n- … and %d more", w.left)
	}
	return w.sb.String()
}

type rejectionWriter struct {
	sb    strings.Builder
	lines int
	left  int // causes not written, past causeLimit
}

// write writes e and its causes at indent, as the library's display does:
// a reference with a single cause is not a line of its own.
func (w *rejectionWriter) write(e *jsonschema.ValidationError, indent int) {
	_, ref := e.ErrorKind.(*kind.Reference)
	if !(ref && len(e.Causes) == 1) {
		if w.lines == causeLimit {
			w.left++
		} else {
			w.line(e, indent)
		}
		indent++
	}
	for _, c := range e.Causes {
		w.write(c, indent)
	}
}

func (w *rejectionWriter) line(e *jsonschema.ValidationError, indent int) {
	w.lines++
	if indent > 0 {
		w.sb.WriteByte('\n')
		w.sb.WriteString(strings.Repeat("  ", indent-1))
		w.sb.WriteString("- ")
	}
	k := bounded(e.ErrorKind)
	if _, ok := k.(*kind.Schema); ok {
		w.sb.WriteString(k.LocalizedString(rejectionPrinter))
		return
	}
	w.sb.WriteString("at " + quote(location(e.InstanceLocation)) + ": " + k.LocalizedString(rejectionPrinter))
}

// location is the JSON pointer of an instance location, each token
// clipped, and of a location deeper than 2×locationEnds tokens only the
// first and last locationEnds, with a token counting those left out.
func location(tokens []string) string {
	var sb strings.Builder
	for i, tok := range tokens {
		if n := len(tokens) - 2*locationEnds; n > 0 && i >= locationEnds && i < len(tokens)-locationEnds {
			if i == locationEnds {
				fmt.Fprintf(&sb, "/… %d more", n)
			}
			continue
		}
		sb.WriteByte('/')
		sb.WriteString(strings.ReplaceAll(strings.ReplaceAll(clip(tok), "~", "~0"), "/", "~1"))
	}
	return sb.String()
}

// bounded is k with what it quotes from the arguments cut, or k itself
// when it quotes nothing unbounded.
func bounded(k jsonschema.ErrorKind) jsonschema.ErrorKind {
	switch k := k.(type) {
	case *kind.Pattern:
		return &kind.Pattern{Got: clip(k.Got), Want: k.Want}
	case *kind.Format:
		got := k.Got
		if s, ok := got.(string); ok {
			got = clip(s)
		}
		return &kind.Format{Got: got, Want: k.Want, Err: clippedError{k.Err}}
	case *kind.PropertyNames:
		return &kind.PropertyNames{Property: clip(k.Property)}
	case *kind.AdditionalProperties:
		return &kind.AdditionalProperties{Properties: clipList(k.Properties)}
	case *kind.Required:
		return &kind.Required{Missing: clipList(k.Missing)}
	case *kind.Dependency:
		return &kind.Dependency{Prop: clip(k.Prop), Missing: clipList(k.Missing)}
	case *kind.DependentRequired:
		return &kind.DependentRequired{Prop: clip(k.Prop), Missing: clipList(k.Missing)}
	case *kind.ContentEncoding:
		return &kind.ContentEncoding{Want: k.Want, Err: clippedError{k.Err}}
	case *kind.ContentMediaType:
		return &kind.ContentMediaType{Want: k.Want, Err: clippedError{k.Err}}
	case *kind.MinContains:
		if len(k.Got) > listLimit {
			return worded{k, containsText("min", k.Want, k.Got)}
		}
	case *kind.MaxContains:
		if len(k.Got) > listLimit {
			return worded{k, containsText("max", k.Want, k.Got)}
		}
	}
	return k
}

// containsText is minContains' or maxContains' message as the library
// words it, listing the first listLimit indices of the items that matched.
func containsText(bound string, want int, got []int) string {
	list := fmt.Sprint(got[:listLimit])
	return rejectionPrinter.Sprintf("%s %d items required to match contains schema, but matched %d items at %v",
		bound, want, len(got), list[1:len(list)-1]+" …")
}

// worded is an error kind whose message is already written.
type worded struct {
	jsonschema.ErrorKind
	text string
}

func (w worded) LocalizedString(*message.Printer) string { return w.text }

// clip is s when it is at most quotedLimit bytes, else its first
// quotedLimit bytes (whole runes) and the size it had.
func clip(s string) string {
	if len(s) <= quotedLimit {
		return s
	}
	return fmt.Sprintf("%s… (%d bytes)", events.Clip(s, quotedLimit), len(s))
}

// clipList is names, each clipped, the first listLimit of them and a last
// one counting the rest.
func clipList(names []string) []string {
	n := min(len(names), listLimit)
	out := make([]string, 0, n+1)
	for _, s := range names[:n] {
		out = append(out, clip(s))
	}
	if len(names) > n {
		out = append(out, fmt.Sprintf("… %d more", len(names)-n))
	}
	return out
}

// clippedError is an error whose text is clipped.
type clippedError struct{ err error }

func (e clippedError) Error() string {
	if e.err == nil {
		return "<nil>"
	}
	return clip(e.err.Error())
}

// quote quotes s as the library does: Go-quoted, in single quotes, double
// quotes left bare.
func quote(s string) string {
	q := fmt.Sprintf("%q", s)
	q = strings.ReplaceAll(q, `\"`, `"`)
	q = strings.ReplaceAll(q, `'`, `\'`)
	return "'" + q[1:len(q)-1] + "'"
}
