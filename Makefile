# PolyLoop's developer targets. `make ci` is what .ci/run executes.
GO      ?= go
PKGS    := ./...
BENCH   ?= .
COUNT   ?= 5

FUZZTIME ?= 60s

.PHONY: build fmt test test-notice check prop soak bench bench-peer demo ci fuzz damage mutate

build:
	$(GO) build $(PKGS)

# The tests alone, race detector on, benchmarks off (make ci, the README's
# test command, runs them with gofmt and go vet, built for speed).
# The PostgreSQL tests need initdb (or POLYLOOP_PG_DSN) and the viewer's
# end-to-end test Chromium; without, they skip, saying so in one line.
test: test-notice
	$(GO) test -race -count=1 $(PKGS)

test-notice:
	@if [ -z "$$POLYLOOP_PG_DSN" ] && ! command -v initdb >/dev/null && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
		echo "PostgreSQL tests skip: no initdb found; install PostgreSQL (apt-get install postgresql) or set POLYLOOP_PG_DSN to run them"; fi
	@if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null && ! command -v google-chrome >/dev/null; then \
		echo "The viewer's browser test skips: no Chromium; apt-get install chromium to run it"; fi

# gofmt over every Go file of the tree (no git needed: a ZIP download works
# too; an empty list is an error, never gofmt reading standard input).
fmt:
	@files=$$(find . -name '*.go' -not -path './.git/*' -not -path './testdata/*' -type f); \
	if [ -z "$$files" ]; then echo "fmt: no Go files found under $$(pwd)"; exit 1; fi; \
	out=$$(gofmt -l $$files); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# gofmt, go vet, and the import rules (deps_test.go: no command or example
# links test support, the engine links no store). Everything compiles with
# the race detector, as the tests do, so a cold build cache compiles each
# package once: without it vet would compile the whole tree a second time,
# a minute or more on two cores.
check: fmt
	$(GO) vet -race $(PKGS)
	$(GO) test -race -count=1 .

# make ci: gofmt, then go vet's whole suite and the tests in one go
# command. go test -vet=all runs the same analyzers go vet runs on each
# package it tests, inside the test run's own build, so a package's vet
# overlaps other packages' tests; go vet before go test vetted every
# package twice (go test runs a subset of vet itself). go test vets only
# packages with tests: go vet takes the rest (UNTESTED; compiled by then).
#
# What keeps it short (four and a half to five minutes on two cores from
# an empty build cache: 265, 277 and 294 s, and 261-306 s in nine runs of
# nearly the same code, by the machine's load):
# - CIFLAGS: no DWARF from the compiler or the linker (a fifth less to
#   compile and link; stack traces and race reports read the binary's
#   own tables, not DWARF). Exported in GOFLAGS, so the go commands the
#   tests run (internal/testbuild, go list) build alike and hit the cache.
# - go build of the libraries first (LIBS: the packages with code of
#   their own but the commands, whose binaries nothing would use; the
#   module's root holds only a test): the tests that build
#   commands to run as processes (--version, polyloop-inspect's, the
#   refund example's) start as soon as their small test binaries link,
#   and would otherwise compile the tree beside the test run's own
#   compile of it.
# - FIRST first: the packages whose tests spend most of their time
#   waiting (a browser, servers starting and dying, worker processes),
#   then the five whose tests take longest, are compiled and run first,
#   beside the rest, instead of last and alone (go test runs packages in
#   the order given; ./... then adds the others once): the short ones
#   fill the end, where one long package alone left a core idle.
# - GORACE=atexit_sleep_ms=0 (unless GORACE names it): a program built
#   with -race sleeps a second as it exits, for other threads' race
#   reports to print; a test binary fails on a race as it happens, and
#   the exit status says so too. Each of the 36 test binaries held its
#   place among the -p 3 for that second, and a test waited a second more
#   for each program it ran and waited for.
# - -p 3: tests wait on PostgreSQL, Chromium, sockets and child processes,
#   and a third package at a time uses the time they leave; it costs more
#   CPU (about 60 seconds more) and saves little wall time: 318-349 s in
#   four cold runs, against 335 and 368 s with go test's default of two.
CIFLAGS  = -gcflags=all=-dwarf=false -ldflags=-w
FIRST    = ./viewer ./otelsink ./pgstore/pgtest ./cmd/polyloop-admin ./worker \
           ./proptest ./pgstore ./kv ./engine ./events
LIBS     = $(shell $(GO) list -f '{{if and .GoFiles (ne .Name "main")}}{{.ImportPath}}{{end}}' $(PKGS))
UNTESTED = $(shell $(GO) list -f '{{if not (or .TestGoFiles .XTestGoFiles)}}{{.ImportPath}}{{end}}' $(PKGS))
ci: export override GOFLAGS := $(strip $(GOFLAGS) $(CIFLAGS))
ci: export override GORACE := $(if $(findstring atexit_sleep_ms,$(GORACE)),$(GORACE),$(strip $(GORACE) atexit_sleep_ms=0))
ci: fmt test-notice
	$(GO) build -race $(LIBS)
	$(GO) test -race -count=1 -vet=all -p 3 $(FIRST) $(PKGS)
	$(if $(strip $(UNTESTED)),$(GO) vet -race $(UNTESTED))

# The long soaks at full count (POLYLOOP_SOAK=1, package internal/soak):
# 1,000 generated runs per property and the driver races, the SIGKILL
# loops at 20 kills per store, the worker fleets' 4 kills on PostgreSQL
# and 3 on a file, 200 decision races per store, every 7th
# damaged copy of each kind refused and released by Open — under the race
# detector — and then the whole damage corpus (make damage), without it:
# 8,352 child processes, which the race detector would make slower than CI
# allows. make test runs the same tests at smaller counts; CI runs both.
# SOAK_RUN names every test that asks soak for its count
# (TestSoakRunNamesEverySoakedTest checks).
SOAK_RUN ?= Property|RealCrash|DamageCorpus|TwoDecisionsOnOneCall|DecisionRacingAResume|RefusedOpenReleases|FleetOfWorkerProcesses|PoolOnABboltFile
soak:
	POLYLOOP_SOAK=1 $(GO) test -race -count=1 -timeout 60m -skip '^TestDamageCorpus$$' -run '$(SOAK_RUN)' ./proptest ./engine ./kv ./events ./worker
	$(MAKE) damage

# Property tests with 100,000 generated runs each: 100× make soak's 1,000,
# 1,000× make test's (and make ci's) 100.
prop:
	$(GO) test -count=1 -run 'Property' ./proptest -rapid.checks=100000 -v

# The whole damage corpus (make test runs a sample of it, make soak and CI
# all of it): every damaged copy of a store opened read-only and read-write
# in a child process, as many at once as there are processors.
damage:
	$(GO) test -count=1 -run '^TestDamageCorpus$$' ./proptest -damage.all -v -timeout 60m

# Mutation testing with gremlins (not in CI: it takes tens of minutes).
# Each package in MUTATE is mutated alone; its own tests judge engine, events and kv,
# the whole suite (--integration) judges recovery and seams, whose rules the
# property tests in proptest and the stores' contract tests exercise.
# pgstore works too (make mutate MUTATE=pgstore: its tests start a PostgreSQL
# server per mutant, pgtest excluded from mutation) but takes an hour or more,
# so by default only its case conditions are negated, below.
# Results: mutation-<pkg>.json and the console; see MUTATION.md.
GREMLINS ?= $(GO) run github.com/go-gremlins/gremlins/cmd/gremlins@v0.6.0
MUTATE   ?= engine events recovery kv seams parsers report retention viewer otelsink
WORKERS  ?= 2
TOPDIRS  := cmd crashstore engine events examples kv openai otelsink parsers pgstore projections proptest recovery report retention scripted scripts seams stores viewer
mutate:
	@for p in $(MUTATE); do \
		ex=""; for d in $(TOPDIRS); do [ "$$d" = "$$p" ] || ex="$$ex -E ^$$d/"; done; \
		integ=""; case $$p in recovery|seams) integ="--integration";; pgstore) ex="$$ex -E ^pgstore/pgtest/";; esac; \
		echo "== $$p $$integ"; \
		GOFLAGS=-count=1 $(GREMLINS) unleash $$integ --workers $(WORKERS) --timeout-coefficient 10 -o mutation-$$p.json $$ex || exit 1; \
	done
	TESTS="./seams/... ./kv ./engine ./recovery ./proptest" ./scripts/mutate-cases.sh engine/machine.go recovery/fold.go recovery/recovery.go seams/store.go kv/store.go kv/open.go kv/commit.go kv/apply.go kv/read.go
	TESTS="./viewer" RUN=. ./scripts/mutate-cases.sh viewer/viewer.go
	TESTS="./pgstore" RUN=. TIMEOUT=5m ./scripts/mutate-cases.sh pgstore/store.go pgstore/migrate.go pgstore/retention.go

# Each fuzz target for a bounded time; the committed corpora under
# testdata/fuzz also run as ordinary tests in make test.
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzUnmarshal$$' -fuzztime $(FUZZTIME) ./events
	$(GO) test -run '^$$' -fuzz '^FuzzClassify$$' -fuzztime $(FUZZTIME) ./recovery

# Benchmarks beside the raw bbolt and pgx floors; see BENCHMARKS.md.
# COUNT rounds, each running every benchmark once, so that a ratio's two
# sides (a floor and PolyLoop, runs=1 and runs=64) are medians of
# interleaved runs rather than of runs minutes apart.
bench:
	: > bench.out
	for i in $$(seq $(COUNT)); do \
		$(GO) test -run '^$$' -bench '$(BENCH)' -count=1 ./events ./kv ./engine >> bench.out || exit 1; \
	done
	$(GO) run ./cmd/polyloop-benchtable < bench.out

# PolyLoop beside DBOS Transact Go and the raw floors on PostgreSQL
# (bench/fleet, a module of its own so the library never depends on the
# peer): COUNT interleaved rounds.
bench-peer:
	for i in $$(seq $(COUNT)); do \
		(cd bench/fleet && $(GO) test -run '^$$' -bench 'Fleet' -count=1) || exit 1; \
	done

# The main job: a demo run on a store file in the working directory, then an
# inspection of that store.
DEMO_STORE ?= polyloop-demo.db
demo:
	$(GO) run ./cmd/polyloop-demo -store $(DEMO_STORE)
	$(GO) run ./cmd/polyloop-inspect runs $(DEMO_STORE)
	$(GO) run ./cmd/polyloop-inspect verify $(DEMO_STORE)

