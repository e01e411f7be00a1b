# ebpf-cni: run `make help` for the targets.
SHELL := /bin/bash
GO ?= go
BIN := bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/ebpf-cni/ebpf-cni/pkg/buildinfo.Version=$(VERSION)
DESTDIR ?=
CNI_BIN_DIR ?= /opt/cni/bin

# Debian packages the build, tests, demo and benchmarks need.
DEB_PKGS := clang-16 llvm-16 libbpf-dev bpftool iproute2 iperf3 sockperf iputils-ping iptables containernetworking-plugins

.PHONY: help deps generate check-generated build test install clean bench

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# apt-install installs the Debian packages of $(1) that are missing.
define apt-install
	@missing=""; for p in $(1); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
endef

deps: ## install the Debian packages and Go modules the project needs (idempotent)
	$(call apt-install,$(DEB_PKGS))
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
demo: build ## the main job on a simulated node: three pods through ebpf-cni, ping/TCP, counters; as root
	$(GO) run ./test/demo -bin $(BIN)

# The kernel test: qemu (TCG: no KVM needed), debootstrap for the guest's root
# filesystem, cpio for its initramfs, kmod (depmod) for the kernel's modules.
VM_DEB_PKGS := qemu-system-x86 debootstrap cpio kmod
KERNEL ?= # a Debian kernel package; empty: the one linux-image-amd64 depends on (Debian 12: 6.1)
VM_CACHE ?= /var/cache/ebpf-cni-vm
VM_TESTS ?= test/datapath test/cli test/ipam
VM_RUN ?=
VM_SKIP ?=
.PHONY: test-kernel
test-kernel: deps ## boot a Debian kernel (KERNEL=linux-image-6.1.0-NN-amd64) in qemu, run the integration tests in it (VM_TESTS, VM_RUN, VM_SKIP); as root; see docs/kernels.md
	$(call apt-install,$(VM_DEB_PKGS))
	KERNEL="$(strip $(KERNEL))" VM_CACHE="$(VM_CACHE)" VM_TESTS="$(VM_TESTS)" VM_RUN="$(VM_RUN)" VM_SKIP="$(VM_SKIP)" test/kernel/run.sh
