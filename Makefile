SHELL := /bin/bash
# kproxy's front door. CI runs `make ci` (through .ci/run).
GO      ?= go
BIN     ?= bin
GOFLAGS ?=
FUZZTIME ?= 20s

.PHONY: all build test unit fuzz e2e e2e-etcd34 e2e-long e2e-ipvs bench bench-scale bench-ipvs bench-relay bench-smoke lint demo ci clean testbed-deps

all: build

## static binaries (no cgo), as the image's
build:
	CGO_ENABLED=0 $(GO) build -o $(BIN)/kproxy ./cmd/kproxy
	CGO_ENABLED=0 $(GO) build -o $(BIN)/kproxy-echo ./test/echo

## unit tests, race detector on
unit:
	$(GO) test -race -count=1 ./...

## short bounded fuzzing of the parsers and the model
fuzz:
	bash hack/fuzz.sh $(FUZZTIME)

## real traffic through the real kernel against a real API server (root).
## What needs IPVS or SCTP (this machine's kernel has neither) runs in the
## VM, in e2e-ipvs.
E2E_HOST_SKIP ?= TestIPVSMode|TestMigrationIPVS|TestRollbackIPVS|TestFeatures/.*/.*/SCTP
e2e: build testbed-deps
	$(GO) test -tags e2e -count=1 -timeout 40m -v -skip '$(E2E_HOST_SKIP)' ./test/e2e/... 2>&1 | tee $(BIN)/e2e.log | grep -E '^(=== RUN| *--- |PASS|FAIL|ok|panic)|e2e:' ; rc=$${PIPESTATUS[0]}; [ $$rc = 0 ] || bash hack/failures.sh $(BIN)/e2e.log; exit $$rc

## a quick subset against Debian's etcd-server 3.4.23 instead of etcd 3.6:
## the API server refuses watch-list there, so informers LIST (the path
## kproxy's streamed lists are for); see test/testbed/README.md.
E2E_ETCD34_RUN ?= TestControlPlane|TestKproxy
e2e-etcd34: build testbed-deps
	KPROXY_ETCD=debian $(GO) test -tags e2e -count=1 -timeout 15m -v -run '$(E2E_ETCD34_RUN)' ./test/e2e/... 2>&1 | tee $(BIN)/e2e-etcd34.log | grep -E '^(=== RUN| *--- |PASS|FAIL|ok|panic)|e2e:' ; rc=$${PIPESTATUS[0]}; [ $$rc = 0 ] || bash hack/failures.sh $(BIN)/e2e-etcd34.log; exit $$rc

## IPVS mode (and SCTP) on Debian's stock kernel under qemu: the e2e cases
## with real traffic, inside the VM (test/vm/vm.sh; the kernel is cached).
## The SCTP case runs there for nftables, iptables and userspace mode too.
E2E_IPVS_RUN ?= TestKproxy|TestFeatures|TestIPVSMode|TestMigrationIPVS|TestRollbackIPVS
E2E_IPVS_SKIP ?=
E2E_VM_SCTP_RUN ?= TestFeatures/(nftables|iptables|userspace)/.*/SCTP
e2e-ipvs: build testbed-deps
	$(GO) test -c -tags e2e -o $(BIN)/e2e.test ./test/e2e
	KPROXY_BIN=$(abspath $(BIN))/kproxy KPROXY_ECHO=$(abspath $(BIN))/kproxy-echo \
		bash test/vm/vm.sh -t 2700 -e KPROXY_BIN -e KPROXY_ECHO -- \
		sh test/vm/e2e.sh $(BIN)/e2e.test "$(E2E_IPVS_RUN)" "$(E2E_IPVS_SKIP)" "$(E2E_VM_SCTP_RUN)" \
		2>&1 | tee $(BIN)/e2e-ipvs.log | grep -E '^(=== RUN| *--- |PASS|FAIL|ok|panic)|e2e:|vm.sh:' ; rc=$${PIPESTATUS[0]}; [ $$rc = 0 ] || bash hack/failures.sh $(BIN)/e2e-ipvs.log; exit $$rc

## long run (root): steady churn against kproxy on the testbed, reporting
## RSS and goroutine slopes and sync durations per window; fails on a
## goroutine leak, uncoalesced syncs or a backlog (test/bench/soak_test.go).
## CI runs 1k Services for 5 minutes; the hour at 10k:
## make e2e-long SOAK_SERVICES=10000 SOAK_DURATION=60m
SOAK_SERVICES ?= 1000
SOAK_DURATION ?= 5m
SOAK_RATE     ?= 10
SOAK_CREATE_EVERY ?= 4
SOAK_MODE     ?= nftables
e2e-long: build testbed-deps
	KPROXY_SOAK=1 BENCH_SERVICES=$(SOAK_SERVICES) BENCH_ENDPOINTS=10 BENCH_MODE=$(SOAK_MODE) BENCH_PROXY=kproxy \
		SOAK_DURATION=$(SOAK_DURATION) SOAK_RATE=$(SOAK_RATE) SOAK_CREATE_EVERY=$(SOAK_CREATE_EVERY) \
		KPROXY_BIN=$(abspath $(BIN))/kproxy KPROXY_ECHO=$(abspath $(BIN))/kproxy-echo \
		$(GO) test -tags e2e -run TestSoak -count=1 -v -timeout 180m ./test/bench/ 2>&1 | tee $(BIN)/e2e-long.log | grep -E '^(=== RUN| *--- |PASS|FAIL|ok|panic)|soak:' ; rc=$${PIPESTATUS[0]}; [ $$rc = 0 ] || bash hack/failures.sh $(BIN)/e2e-long.log; exit $$rc

## what the README calls "the test command"
test: lint unit fuzz e2e e2e-etcd34 e2e-long e2e-ipvs bench-smoke

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

## the userspace mode's relays against nftables mode on one bed (root):
## request latency and rate on new connections, one connection's upload
## rate, RSS per open connection (test/bench/relay_test.go)
bench-relay: build testbed-deps
	KPROXY_RELAY_BENCH=1 BENCH_SERVICES=$(SERVICES) BENCH_ENDPOINTS=$(ENDPOINTS) BENCH_DP_SECONDS=10 \
		KPROXY_BIN=$(abspath $(BIN))/kproxy KPROXY_ECHO=$(abspath $(BIN))/kproxy-echo \
		$(GO) test -tags e2e -run TestRelayFigures -count=1 -v -timeout 30m ./test/bench/

## the scale benchmark in IPVS mode, in the VM (test/vm; TCG, so its figures
## compare kproxy with upstream, not with the host's modes): figures into
## docs/performance.md and test/bench/results, as bench-scale does.
## e.g. make bench-ipvs SERVICES=10000 ENDPOINTS=10
BENCH_VM_COLD_TIMEOUT ?= 1800
bench-ipvs: build testbed-deps
	$(GO) test -c -tags e2e -o $(BIN)/bench.test ./test/bench
	rm -rf $(BIN)/vmkeep && mkdir -p $(BIN)/vmkeep && cp test/bench/results/results.json docs/performance.md $(BIN)/vmkeep/
	$(BENCH_ENV) BENCH_MODE=ipvs BENCH_COLD_TIMEOUT=$(BENCH_VM_COLD_TIMEOUT) BENCH_STORM_TIMEOUT=1800 \
		BENCH_RESULTS=/vmout/keep/results.json BENCH_DOC=/vmout/keep/performance.md \
		BENCH_COMMAND="make bench-ipvs SERVICES=$(SERVICES) ENDPOINTS=$(ENDPOINTS) PROXY=$(PROXY) RUNS=$(RUNS) IDLE=$(IDLE)" \
		bash test/vm/vm.sh -t 12000 -k $(BIN)/vmkeep $(foreach v,KPROXY_BENCH BENCH_SERVICES BENCH_ENDPOINTS BENCH_MODE BENCH_PROXY BENCH_RUNS BENCH_IDLE BENCH_CHANGES KPROXY_BIN KPROXY_ECHO BENCH_COLD_TIMEOUT BENCH_STORM_TIMEOUT BENCH_CHANGE_TIMEOUT BENCH_RESULTS BENCH_DOC BENCH_COMMAND,-e $(v)) -- \
		sh -c 'cd test/bench && ../../$(BIN)/bench.test -test.run TestScale -test.v -test.timeout 180m'
	cp $(BIN)/vmkeep/results.json test/bench/results/results.json
	cp $(BIN)/vmkeep/performance.md docs/performance.md

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

# lint: gofmt, go vet, staticcheck (pinned, fetched from the module proxy on
# first use; every check, see staticcheck.conf), both with and without the
# e2e build tag, and the file-size limit of hack/filesize.sh.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet ./...
	$(GO) vet -tags e2e ./test/...
	$(GO) run $(STATICCHECK) ./...
	$(GO) run $(STATICCHECK) -tags e2e ./test/...
	bash hack/filesize.sh

demo: build
	bash test/demo/demo.sh

ci: test

clean:
	rm -rf $(BIN)
