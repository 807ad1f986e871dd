# PolyLoop's developer targets. `make ci` is what .ci/run executes.
GO      ?= go
PKGS    := ./...
BENCH   ?= .
COUNT   ?= 5

.PHONY: build test check prop bench demo ci fuzz

build:
	$(GO) build $(PKGS)

# The test command the README gives: race detector on, benchmarks off.
test:
	$(GO) test -race -count=1 $(PKGS)

check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

# Property tests with a hundred times CI's generated cases.
prop:
	$(GO) test -count=1 -run 'Property|Contract|Folding' ./... -rapid.checks=10000

# Benchmarks beside the raw bbolt floor; see BENCHMARKS.md.
bench:
	$(GO) test -run '^$$' -bench '$(BENCH)' -count=$(COUNT) ./...

demo:
	$(GO) run ./cmd/polyloop-demo

ci: check build test
