SHELL := /bin/bash
# kproxy's front door. CI runs `make ci` (through .ci/run).
GO      ?= go
BIN     ?= bin
GOFLAGS ?=
FUZZTIME ?= 20s

.PHONY: all build test unit fuzz e2e e2e-ipvs bench bench-scale bench-smoke lint demo ci clean testbed-deps

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
	$(GO) test -tags e2e -count=1 -timeout 40m -v -skip 'TestIPVSMode|TestMigrationIPVS|TestRollbackIPVS' ./test/e2e/... 2>&1 | tee $(BIN)/e2e.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic)|e2e:' ; exit $${PIPESTATUS[0]}

## IPVS mode (and SCTP) on Debian's stock kernel under qemu: the e2e cases
## with real traffic, inside the VM (test/vm/vm.sh; the kernel is cached)
E2E_IPVS_RUN ?= TestKproxy|TestFeatures|TestIPVSMode|TestMigrationIPVS|TestRollbackIPVS
# Open defect, left out until fixed (README, IPVS mode): in IPVS mode an
# IPv4 UDP flow from a fixed source port to a new ClusterIP got no answer.
E2E_IPVS_SKIP ?= TestFeatures/ipvs/ipv4/StaleConntrackUDP
e2e-ipvs: build testbed-deps
	$(GO) test -c -tags e2e -o $(BIN)/e2e.test ./test/e2e
	KPROXY_BIN=$(abspath $(BIN))/kproxy KPROXY_ECHO=$(abspath $(BIN))/kproxy-echo KPROXY_E2E_MODES=ipvs \
		bash test/vm/vm.sh -t 2700 -e KPROXY_BIN -e KPROXY_ECHO -e KPROXY_E2E_MODES -- \
		sh -c 'cd test/e2e && ../../$(BIN)/e2e.test -test.run "$(E2E_IPVS_RUN)" -test.skip "$(E2E_IPVS_SKIP)" -test.v -test.timeout 40m' \
		2>&1 | tee $(BIN)/e2e-ipvs.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic)|e2e:|vm.sh:' ; exit $${PIPESTATUS[0]}

## what the README calls "the test command"
test: lint unit fuzz e2e e2e-ipvs bench-smoke

testbed-deps:
	bash tools/build-apiserver.sh

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./internal/...

## scale benchmark (root): N Services x M endpoints, kproxy vs upstream, figures into docs/performance.md
## e.g. make bench-scale SERVICES=10000 ENDPOINTS=10 MODE=nftables,iptables PROXY=kproxy,upstream RUNS=3
SERVICES  ?= 1000
ENDPOINTS ?= 10
MODE      ?= nftables
PROXY     ?= kproxy,upstream
RUNS      ?= 1
IDLE      ?= 60
CHANGES   ?= 200
BENCH_ENV  = KPROXY_BENCH=1 BENCH_SERVICES=$(SERVICES) BENCH_ENDPOINTS=$(ENDPOINTS) BENCH_MODE=$(MODE) \
	BENCH_PROXY=$(PROXY) BENCH_RUNS=$(RUNS) BENCH_IDLE=$(IDLE) BENCH_CHANGES=$(CHANGES) \
	KPROXY_BIN=$(abspath $(BIN))/kproxy KPROXY_ECHO=$(abspath $(BIN))/kproxy-echo
bench-scale: build testbed-deps
	$(BENCH_ENV) BENCH_COMMAND="make bench-scale SERVICES=$(SERVICES) ENDPOINTS=$(ENDPOINTS) MODE=$(MODE) PROXY=$(PROXY) RUNS=$(RUNS) IDLE=$(IDLE)" \
		$(GO) test -tags e2e -run TestScale -count=1 -v -timeout 180m ./test/bench/

## the same benchmark at smoke size, < 3 min (CI: keeps it from rotting; writes only under $(BIN))
bench-smoke: SERVICES = 50
bench-smoke: ENDPOINTS = 2
bench-smoke: MODE = nftables,iptables
bench-smoke: PROXY = kproxy,upstream
bench-smoke: RUNS = 1
bench-smoke: IDLE = 2
bench-smoke: CHANGES = 8
bench-smoke: build testbed-deps
	$(BENCH_ENV) BENCH_DP_SECONDS=1 BENCH_COLD_TIMEOUT=60 BENCH_STORM_TIMEOUT=60 \
		BENCH_RESULTS=$(abspath $(BIN))/bench-smoke.json BENCH_DOC=$(abspath $(BIN))/bench-smoke.md BENCH_COMMAND="make bench-smoke" \
		$(GO) test -tags e2e -run TestScale -count=1 -v -timeout 10m ./test/bench/

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet ./...
	$(GO) vet -tags e2e ./test/...

demo: build
	bash test/demo/demo.sh

ci: test

clean:
	rm -rf $(BIN)
