# ebpf-cni: run `make help` for the targets.
SHELL := /bin/bash
GO ?= go
BIN := bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/ebpf-cni/ebpf-cni/pkg/buildinfo.Version=$(VERSION)
DESTDIR ?=
CNI_BIN_DIR ?= /opt/cni/bin

# Debian packages the build, tests, demo and benchmarks need (ca-certificates:
# go mod download over TLS; a minimal Debian 12 has none).
DEB_PKGS := ca-certificates clang-16 llvm-16 libbpf-dev bpftool iproute2 iperf3 sockperf iputils-ping iptables containernetworking-plugins

.PHONY: help deps generate check-generated build test install clean bench

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

deps: ## install the Debian packages and Go modules the project needs (idempotent)
	@missing=""; for p in $(DEB_PKGS); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "deps: installing Debian packages:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	else echo "deps: Debian packages present: $(DEB_PKGS)"; \
	fi
	@$(GO) mod download

generate: ## compile bpf/*.c with bpf2go into pkg/ (reproducible; commit the output)
	$(GO) generate ./pkg/...

check-generated: ## fail if the committed bpf2go output differs from a fresh generate
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	cp -a go.mod go.sum bpf pkg $$tmp/ && (cd $$tmp && $(GO) generate ./pkg/... >/dev/null) && \
	for f in $$(cd $$tmp && ls pkg/*/*_bpfel.go pkg/*/*_bpfel.o); do \
		cmp -s $$f $$tmp/$$f || { echo "stale generated file: $$f (run make generate and commit)"; exit 1; }; \
	done; echo "generated objects are current"

# Static binaries: a plugin is exec'd for every call, and ld.so plus libc
# initialisation cost more than the IPAM work itself.
build: ## build bin/ebpf-cni and bin/ebpf-ipam
	CGO_ENABLED=0 $(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/ebpf-cni ./cmd/ebpf-ipam

test: deps build check-generated ## run every test (unit, integration in namespaces); as root
	$(GO) vet ./...
	$(GO) test -count=1 -p 1 -timeout 30m ./...

install: build ## install the plugins into $(DESTDIR)$(CNI_BIN_DIR)
	install -d $(DESTDIR)$(CNI_BIN_DIR)
	install -m 0755 $(BIN)/ebpf-cni $(BIN)/ebpf-ipam $(DESTDIR)$(CNI_BIN_DIR)/

clean: ## remove build output
	rm -rf $(BIN)

BENCH ?= full
BENCH_FLAGS ?= # e.g. -ebpf-features masq,hostport,bandwidth, or -note "what else ran"
bench: build ## REF, EBPF and RAW side by side into test/bench/results (full: ~15 min; BENCH=quick: <3 min); as root
	$(GO) run ./test/bench -profile $(BENCH) -bin $(BIN) -out test/bench/results $(BENCH_FLAGS)
	$(GO) run ./test/bench/ipam -n $(if $(filter quick,$(BENCH)),200,1000) -bin $(BIN)

.PHONY: demo
demo: deps build ## the product in under a minute on a simulated node: pods, masquerade, hostPort, bandwidth, vs bridge+iptables, the CLI; as root
	$(GO) run ./test/demo -bin $(BIN)
