SHELL := /bin/bash
# kproxy's front door. CI runs `make ci` (through .ci/run).
GO      ?= go
BIN     ?= bin
GOFLAGS ?=
FUZZTIME ?= 20s

.PHONY: all build test unit fuzz e2e bench bench-scale lint demo ci clean testbed-deps

all: build

build:
	$(GO) build -o $(BIN)/kproxy ./cmd/kproxy
	$(GO) build -o $(BIN)/kproxy-echo ./test/echo

## unit tests, race detector on
unit:
	$(GO) test -race -count=1 ./...

## short bounded fuzzing of the parsers and the model
fuzz:
	bash hack/fuzz.sh $(FUZZTIME)

## real traffic through the real kernel against a real API server (root)
e2e: build testbed-deps
	$(GO) test -tags e2e -count=1 -timeout 40m -v ./test/e2e/... 2>&1 | tee $(BIN)/e2e.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic)|e2e:' ; exit $${PIPESTATUS[0]}

## what the README calls "the test command"
test: lint unit fuzz e2e

testbed-deps:
	bash tools/build-apiserver.sh

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./internal/...

bench-scale: build testbed-deps
	$(GO) test -tags e2e -run TestScale -v -timeout 60m ./test/bench/...

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet ./...
	$(GO) vet -tags e2e ./test/...

demo: build
	bash test/demo/demo.sh

ci: test

clean:
	rm -rf $(BIN)
