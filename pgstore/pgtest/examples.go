package pgtest

import (
	"flag"
	"fmt"
	"regexp"
	"strings"
)

// leaveOut decides which of examples, the Example functions needing a
// server, a test binary run with -test.run run and -test.skip skip leaves
// out: those it selects, when lookup (called only then) finds no server
// for the reason tests skip. It returns the -test.skip to run with and
// what to say on stderr ("" for nothing).
func leaveOut(examples []string, run, skip string, required bool, lookup func() error) (string, string) {
	var selected []string
	for _, name := range examples {
		if matchesTop(run, name, true) && !(skip != "" && !strings.Contains(skip, "/") && matchesTop(skip, name, false)) {
			selected = append(selected, name)
		}
	}
	if len(selected) == 0 {
		return skip, ""
	}
	err := lookup()
	if err == nil {
		return skip, ""
	}
	if ok, _ := unavailableFor(err, required); !ok {
		return skip, "" // they run and fail, saying why
	}
	names := strings.Join(selected, ", ")
	if strings.Contains(skip, "/") {
		// A pattern with several elements skips subtests, not a whole
		// test: nothing can be added to it to skip an example.
		return skip, fmt.Sprintf("%s need a PostgreSQL server and -test.skip %q cannot be extended to leave them out: they run without one (%v)", names, skip, err)
	}
	quoted := make([]string, len(selected))
	for i, name := range selected {
		quoted[i] = regexp.QuoteMeta(name)
	}
	pattern := "^(?:" + strings.Join(quoted, "|") + ")$"
	if skip != "" {
		pattern = skip + "|" + pattern
	}
	return pattern, fmt.Sprintf("%s not run: %s (%v)", names, SkipHint, err)
}

// matchesTop reports whether pattern's first element (what -test.run and
// -test.skip match a top-level test's name against) matches name; an
// empty pattern is empty, and a pattern that does not compile is taken
// to match (the testing package reports it).
func matchesTop(pattern, name string, empty bool) bool {
	if pattern == "" {
		return empty
	}
	top, _, _ := strings.Cut(pattern, "/")
	re, err := regexp.Compile(top)
	return err != nil || re.MatchString(name)
}

// flagValue is the value of the test binary's flag name, "" when it has
// none.
func flagValue(name string) string {
	if f := flag.Lookup(name); f != nil {
		return f.Value.String()
	}
	return ""
}
