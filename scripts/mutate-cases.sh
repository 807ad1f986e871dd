#!/usr/bin/env bash
# mutate-cases.sh FILE... — the mutants gremlins cannot see: for every
# `case COND:` line of the given files, replace it with `case !(COND):`,
# run the judging tests, restore the file. A mutant that does not compile
# (a tagged or type switch, a case list) is "not viable". Prints one line a
# mutant and a summary; exits 1 if any lived. Judging tests: engine,
# recovery, and proptest's properties (not the damage corpus or the SIGKILL
# test, for time); TESTS and RUN choose others, TIMEOUT bounds each run
# (default 40s; pgstore's tests start a PostgreSQL server and need more).
# Run from the module root; `make mutate` calls it.
set -uo pipefail
TESTS=${TESTS:-"./engine ./recovery ./proptest"}
RUN=${RUN:-'Test[^DK]|TestProperty|TestDurable'}
TIMEOUT=${TIMEOUT:-40s}
killed=0 lived=0 nonviable=0
for f in "$@"; do
	cp "$f" "$f.orig"
	trap 'cp "$f.orig" "$f"; rm -f "$f.orig"' EXIT
	while IFS=: read -r n _; do
		perl -i -pe "if (\$. == $n) { s/^(\s*)case (.+):(\s*)$/\$1case !(\$2):\$3/ }" "$f"
		if ! go build ./... >/dev/null 2>&1; then
			nonviable=$((nonviable + 1))
		elif go test -count=1 -timeout "$TIMEOUT" -run "$RUN" $TESTS >/dev/null 2>&1; then
			lived=$((lived + 1))
			echo "LIVED  $f:$n: $(sed -n "${n}p" "$f.orig" | sed 's/^[[:space:]]*//')"
		else
			killed=$((killed + 1))
			echo "KILLED $f:$n"
		fi
		cp "$f.orig" "$f"
		git clean -fq -- proptest/testdata/rapid # rapid's .fail files from a mutant
	done < <(grep -nE '^\s*case .+:\s*$' "$f")
	rm -f "$f.orig"
	trap - EXIT
done
echo "case conditions negated: $killed killed, $lived lived, $nonviable not viable"
[ "$lived" -eq 0 ]
